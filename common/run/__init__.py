"""A run: its configuration, the commands and their command lines, plugins, processes."""
