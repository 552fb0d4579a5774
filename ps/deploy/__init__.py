"""Deployments of a whole run, generated from the settings: the docker-compose file
(``compose``), the Docker Swarm stack (``stack``) and the limits both give each
container (``resources``), both written as data with PyYAML (``yamlfile``)."""
