"""The system as a whole, above the server and the worker: the corrupting proxy
(``proxy``), the local cluster launcher (``launcher``, ``ps-cluster``), the in-process
reference engine (``reference``, ``ps-simulate``), the paper's experiments
(``experiments``, ``ps-experiment``), figures (``plots``, ``ps-report``), the
docker-compose and Swarm generators (``deploy``), a run's CURVE keys (``keys``,
``ps-keys``) and the chaos runs that attack a local cluster (``chaos``: what
``scripts/chaos.py`` and ``scripts/chaos_faults.py`` run)."""
