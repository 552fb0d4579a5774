"""Declaring and reading settings: the declarations, the registries, run files."""
