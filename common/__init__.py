"""What every role shares, by topic, in layers (``pyproject.toml``'s import contracts):
``run`` (a run's configuration and attack, the commands' table and their command lines,
plugins, start-up and stop, metrics files, the replay window, reused host vectors, the
model's first parameters) above ``net`` (the wire protocol, the sockets and their
guards, keys and their scopes, budgets and refusals, where the shards lie in a message)
and ``learn`` (the aggregation rules and pre-aggregators, the attacks, datasets, models,
seeded randomness), which are independent of each other and above ``conf`` (how a
setting is declared and read, the registries, run files); ``errors`` (the exceptions
and exit codes) serves them all. Nothing here starts a process of its own."""
