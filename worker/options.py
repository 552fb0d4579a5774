"""How a worker or the evaluator reaches the cluster, and how the evaluator measures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from common.settings import CLUSTER, EVALUATOR, EXPERIMENT, SIMULATE, WORKER, setting
from common.sharding import ShardSet, parse_servers

CLIENTS = (WORKER, EVALUATOR)


@dataclass(frozen=True)
class ClientOptions:
    """The settings of one ``ps-worker`` process (a worker or the evaluator)."""

    servers: str | None = setting(
        None, "Comma-separated endpoints of the server processes, in shard order (a proxy's "
        "endpoint stands in for the server it fronts), e.g. "
        "tcp://10.0.0.1:5550,tcp://10.0.0.2:5550: S endpoints host a shard each, P < S "
        "the P contiguous blocks of ps-cluster --server-processes; or SHARDS@ENDPOINT "
        "entries separated by ';' (0-4@tcp://10.0.0.1:5550;5-9@tcp://10.0.0.2:5550).",
        roles=CLIENTS, required=True)
    worker_id: int | None = setting(None, "This worker's id i in 0..n-1 (required unless "
                                    "--evaluate).", roles=(WORKER,), minimum=0)
    evaluate: bool = setting(False, "Run as the evaluator: read-only, measures test loss, "
                             "top-1 and top-3 every --eval-every rounds.", roles=(EVALUATOR,))
    data_dir: Path | None = setting(None, "Directory holding the dataset files (not needed for "
                                    "fashion-mnist from Debian or synthetic).",
                                    roles=(*CLIENTS, CLUSTER, SIMULATE, EXPERIMENT))
    timeout_s: float = setting(60.0, "Seconds to wait for each reply before reconnecting and "
                               "resending.", flag="--timeout",
                               roles=(*CLIENTS, CLUSTER), minimum=0.001)
    retries: int = setting(3, "Resends before giving up with exit code 4.",
                           roles=(*CLIENTS, CLUSTER), minimum=0)

    replay_rounds: int = setting(18, "Gradients of the last K rounds kept, to replay them to a "
                                 "server that restarted from an older checkpoint (K x the "
                                 "model size in memory).", roles=(WORKER, CLUSTER), minimum=0)

    def server_list(self, num_shards: int) -> list[tuple[ShardSet, str]]:
        """The server processes as (shards, endpoint) (``ConfigError`` naming what is
        wrong with --servers)."""
        return parse_servers(self.servers or "", num_shards)


@dataclass(frozen=True)
class EvalOptions:
    """When and on what the evaluator measures the model."""

    eval_every: int = setting(25, "Rounds between evaluations (the last round is always "
                              "evaluated).", roles=(EVALUATOR, CLUSTER, SIMULATE, EXPERIMENT),
                              minimum=1)
    eval_samples: int | None = setting(None, "Evaluate on the first N test samples only "
                                       "(default: all).",
                                       roles=(EVALUATOR, CLUSTER, SIMULATE, EXPERIMENT),
                                       minimum=1)
