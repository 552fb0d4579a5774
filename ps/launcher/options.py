"""How the launcher runs a cluster (beyond what it hands its children)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from common.conf.settings import CLUSTER, setting
from common.errors import ConfigError
from common.net.sharding import ShardSet, server_blocks, shard_ranges


def local_cores() -> int:
    """The cores this process may run on (its affinity: a container's CPU set too)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class ClusterOptions:
    """The settings of ``ps-cluster`` itself."""

    host: str = setting("127.0.0.1", "Loopback address the nodes bind.", roles=(CLUSTER,))
    no_evaluator: bool = setting(False, "Do not start the evaluator.", roles=(CLUSTER,))
    run_timeout_s: float | None = setting(None, "Stop everything (exit 4) if the run takes "
                                          "longer than this many seconds.",
                                          flag="--run-timeout",
                                          roles=(CLUSTER,), minimum=0.001)
    verify: bool = setting(False, "Afterwards run the in-process reference engine with the "
                           "same settings and check that the final parameters are "
                           "bit-identical (exit 5 if not).", roles=(CLUSTER,))
    max_restarts: int = setting(3, "Restart a process that died unexpectedly (a server "
                                "resumes from its checkpoint) up to this many times each; "
                                "0: the first death stops the run.", roles=(CLUSTER,),
                                minimum=0)
    start: str = setting("fork", "How the processes start. fork: the launcher imports torch, "
                         "loads the compiled kernels and decodes the dataset once, then "
                         "forks each server, proxy, worker and the evaluator from itself "
                         "(seconds, shared memory); exec: each a fresh interpreter running "
                         "python -m server.cli / ps.proxy.cli / worker.cli with its flags, "
                         "as a deployment starts them one by one.", roles=(CLUSTER,),
                         choices=("fork", "exec"))
    server_processes: int | None = setting(
        None, "Spread the S shards over this many server processes (contiguous blocks, "
        "each process named after its first shard: server-0, server-5, ...; a worker "
        "sends each one message per round for all its shards). Default: min(S, the "
        "cores here). On 2 cores, S=4 on 1 process is the fastest measured (scripts/"
        "bench_cluster.py --repeats 3: 24.6 rounds/s with keys against 20.7 on 2 and 17.4 "
        "on 4; 34.4 without against 28.3 and 22.9): give 1 there, unless a proxy corrupts "
        "a shard: it then relays every shard of its process (the gambler at S=20: 13-14 "
        "rounds/s on 1 process, 15-16 on 2). The results are the same for every P.",
        roles=(CLUSTER,), minimum=1)
    worker_processes: int | None = setting(
        None, "Run the n workers in this many processes (contiguous blocks, each process "
        "named after its first worker: worker-0, worker-10, ...; each worker keeps its "
        "own key, connections and metrics, and a process computes its workers' gradients "
        "one after the other on one model). Default: min(n, twice the cores here), the "
        "fastest measured (scripts/bench_cluster.py: n=20 on 2 cores, 4 processes as fast "
        "as 2 or faster in 6 of 8 layouts, 20 slower than 4 in 5 of 6). The results are "
        "the same for every value.",
        roles=(CLUSTER,), minimum=1)
    resume: Path | None = setting(None, "Continue the interrupted run in this output "
                                  "directory from its checkpoints, with the run settings it "
                                  "was started with (only ps-cluster's own options, such as "
                                  "--verify and --max-restarts, are taken from this command).",
                                  roles=(CLUSTER,))

    def blocks(self, num_shards: int, default: int | None = None) -> list[ShardSet]:
        """The shards of each server process (``ConfigError`` for more than S); without
        ``--server-processes``, min(S, ``default``), by default the cores here."""
        processes = self.server_processes or min(num_shards, default or local_cores())
        return server_blocks(num_shards, processes)

    def worker_blocks(self, num_workers: int) -> list[tuple[int, ...]]:
        """The workers of each worker process (``ConfigError`` for more than n); without
        ``--worker-processes``, min(n, twice the cores here)."""
        processes = self.worker_processes or min(num_workers, 2 * local_cores())
        if not 1 <= processes <= num_workers:
            raise ConfigError(f"--worker-processes {processes} must be in 1..n={num_workers}")
        return [tuple(range(a, b)) for a, b in shard_ranges(num_workers, processes)]
