"""Deployments of a whole run: the docker-compose file, generated from the settings."""
