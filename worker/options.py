"""How a worker or the evaluator reaches the cluster, and how the evaluator measures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from common.conf.settings import CLUSTER, EVALUATOR, EXPERIMENT, SIMULATE, WORKER, setting
from common.errors import ConfigError
from common.net.sharding import ShardSet, parse_index_set, parse_servers
from common.run.replay import default_replay_rounds

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
    worker_id: str | None = setting(
        None, "The workers this process runs: an id i in 0..n-1, a range a-b or a list (0-4, "
        "1,3); each has its own key, connections, data partition and metrics, and they "
        "compute one after the other on one model (required unless --evaluate).",
        roles=(WORKER,))
    via_proxy: tuple[int, ...] = setting(
        (), "Server processes (by first shard) this worker reaches through the ps-proxy in "
        "front of each (its endpoint in --servers): with --keys it expects the proxy's key "
        "there (proxy-<s>), and still tags its HELLO and push headers end to end for the "
        "server behind it, so the proxy can change values but not speak for it.",
        roles=(WORKER,), minimum=0)
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

    device: str = setting(
        "cpu", "Where the model computes: cpu, cuda (a worker process per GPU in turn, of "
        "those CUDA_VISIBLE_DEVICES shows), cuda:N, or auto (CUDA if torch sees a GPU, else "
        "the CPU). On CUDA the computation is deterministic, so a cluster and ps-simulate "
        "(--verify: on the first GPU) on GPUs of one model end bit-identical; the servers "
        "aggregate on the CPU.",
        roles=(*CLIENTS, CLUSTER, SIMULATE))

    replay_rounds: int | None = setting(
        None, "Gradients of the last K rounds kept, to replay them to a server that "
        "restarted from an older checkpoint (K x the model size in memory per worker). "
        "Default: 18, fewer for a large model (about 256 MiB of float32 a worker, at least "
        "4: 6 at 10.6M parameters; half of it with --wire-dtype bfloat16), whose servers "
        "save more often to match.",
        roles=(WORKER, CLUSTER), minimum=0)

    def replay_window(self, d: int) -> int:
        """``--replay-rounds``, or its default for a model of ``d`` values."""
        if self.replay_rounds is not None:
            return self.replay_rounds
        return default_replay_rounds(d)

    def worker_ids(self, num_workers: int) -> tuple[int, ...]:
        """The workers of ``--worker-id``, sorted (``ConfigError`` naming what is wrong)."""
        if self.worker_id is None:
            raise ConfigError("--worker-id (PS_WORKER_ID) is required for a worker")
        try:
            return parse_index_set(self.worker_id, num_workers, "worker", "n")
        except ConfigError as exc:
            raise ConfigError(f"--worker-id: {exc}") from None

    def server_list(self, num_shards: int) -> list[tuple[ShardSet, str]]:
        """The server processes as (shards, endpoint) (``ConfigError`` naming what is
        wrong with --servers)."""
        return parse_servers(self.servers or "", num_shards)


@dataclass(frozen=True)
class EvalOptions:
    """When and on what the evaluator measures the model, and how often a run's
    per-round metrics become TensorBoard scalars."""

    eval_every: int = setting(25, "Rounds between evaluations (the last round is always "
                              "evaluated).", roles=(EVALUATOR, CLUSTER, SIMULATE, EXPERIMENT),
                              minimum=1)
    eval_samples: int | None = setting(None, "Evaluate on the first N test samples only "
                                       "(default: all).",
                                       roles=(EVALUATOR, CLUSTER, SIMULATE, EXPERIMENT),
                                       minimum=1)
    tensorboard_every: int = setting(
        10, "With the TensorBoard extra installed: the per-round scalars of workers, shards "
        "and proxies every this many rounds (every evaluation and restart is written); 0: "
        "no event files.", roles=(CLUSTER, SIMULATE), minimum=0)
