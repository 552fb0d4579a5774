"""What every role shares: the run's settings and their command lines (``settings``,
``cli``, ``config``), the wire protocol (``protocol``), the aggregation rules and
pre-aggregators (``rules``), the attacks (``attacks``), datasets, models, sharding and
seeding, metrics, errors and exit codes; and the two modules every process runs
through: ``transport`` (the only ZeroMQ socket code, with ``admission``, ``inflight``,
``budgets`` and ``keys`` guarding it) and ``process`` (start-up, stop policy, logging,
exit codes).  Nothing here starts a process of its own."""
