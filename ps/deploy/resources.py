"""What each container of a deployment may use: memory, processes, log space, /tmp.

One function per limit, used by both generators (``docker-compose.yml`` and
``docker/stack.yml``), so the two files always agree and docs/docker.md can state the
formula once.

**Memory** (:func:`memory_limit`): an estimate of what the role's process holds, times
``HEADROOM``, plus the ``/tmp`` tmpfs (its pages are charged to the container), rounded
up to ``ROUND`` (64 MiB). With f = 4 bytes (float32), d the model's parameters, S shards,
d_s = ceil(d / S) the largest shard, k the shards a server process hosts (its block of
``PS_SERVER_PROCESSES``: about S / P of them, 1 when P = S), D = k * d_s the values it holds
per vector, n workers and R = ``PS_REPLAY_ROUNDS``:

* ``server``: ``BASE_TORCH`` (the interpreter with torch, numba/llvmlite, numpy,
  pyzmq) + f * D * (9 n + 12): per hosted shard, the round's (n, d_s) gradient matrix;
  the rule's scratch (a sorted copy, a pre-aggregator's output: 2 n d_s; the shards step
  one after the other, so this counts k - 1 shards' scratch more than a process holds
  at once: a margin); inbound buffering (the pushes of the current and the next round
  as received messages, each carrying all k shards: 2 n D); the PARAMS replies a key
  may leave untaken, ``common.net.transport.REPLIES_HELD`` = 4 each for the n workers and
  the evaluator (4 (n + 1) D: the server drops the ones beyond); and 8 vectors per shard: the
  parameters, the previous ones and a stateful rule's state (kept parameter history),
  the copy handed to the checkpoint writer and one spare (the writer hashes and
  writes the arrays where they are). A process of k shards is so counted as one
  shard of k * d_s values;
* ``proxy``: ``BASE_PROXY`` (numpy and pyzmq, no torch) + f * D * (7 n + 3), D its
  server process's: the pushes of the current and the next round it holds (2 n), a
  whole round copied for the attacks that read the honest vectors (n), the PARAMS
  replies it relays, 4 a worker's connection may leave untaken (4 n: the proxy drops
  the ones beyond, ``common.net.transport.ReplyLedger``) and the corruption's scratch;
* ``worker``: ``BASE_TORCH`` + the dataset (every sample decoded to float32, plus its
  raw bytes while decoding) + f * d * (R + 8): the gradients kept to replay (R d), the
  flat parameters and gradients, the assembled PARAMS, the worker momentum, the pushes
  in flight and autograd's buffers; a Byzantine worker also recomputes the n honest
  gradients (+ n d);
* ``evaluator``: ``BASE_TORCH`` + the dataset + f * d * 8 (the model, the PARAMS it
  assembles, the activations of one evaluation batch are small).

The bases are the peak resident sizes measured with the default MLP (d = 118,282,
negligible beside them): a server 355 MiB, a proxy 48 MiB, a worker on Fashion-MNIST
560 MiB of which 262 MiB are the dataset. A hostile peer's flood is not part of the
estimate: the in-flight guard bounds what one connection can make a node hold, and the
limit is what keeps anything beyond that inside the attacked container (the kernel
kills its process, its restart policy starts it again, a server from its checkpoint).

**Processes** (:func:`pids_limit`): the threads a role runs (``THREADS``: the main
thread, ZeroMQ's I/O and reaper threads, pyzmq's garbage-collector thread for zero-copy
frames, and for the nodes that bind: the ZAP handler and the in-flight guard; a server's
checkpoint writer), torch's compute threads (``PS_TORCH_THREADS``) and ``EXTRA_PROCESSES``
(the healthcheck's ``test``, an operator's ``docker exec``), times ``PIDS_HEADROOM``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from common.learn.data import dataset_spec
from common.run.config import RunConfig

MiB = 1 << 20
FLOAT_BYTES = 4
LABEL_BYTES = 8  # int64
ROUND = 64 * MiB
HEADROOM = 1.5
BASE_TORCH = 360 * MiB  # interpreter + torch + numba/llvmlite + numpy + pyzmq (measured 355)
BASE_PROXY = 64 * MiB  # interpreter + numpy + pyzmq (measured 48)
BASE_SETUP = 32 * MiB  # ps-keys (click, pyzmq; measured 20) and the runs-dir shell
TMPFS_BYTES = 64 * MiB  # /tmp: ready file, numba's cache (NUMBA_CACHE_DIR), XDG_CACHE_HOME
# samples (train + test) a worker and the evaluator decode; an unknown dataset is taken to
# be as large as DEFAULT_SAMPLES
DATASET_SAMPLES = {"fashion-mnist": 70_000, "mnist": 70_000, "cifar10": 60_000,
                   "synthetic": 2_048 + 512}
DEFAULT_SAMPLES = 100_000

THREADS = {
    # main, ZeroMQ I/O + reaper, pyzmq gc, ZAP handler, in-flight guard, checkpoint writer
    "server": 7,
    # main, ZeroMQ I/O + reaper, pyzmq gc, ZAP handler, in-flight guard
    "proxy": 6,
    # main, ZeroMQ I/O + reaper, pyzmq gc
    "worker": 4,
    "evaluator": 4,
    # ps-keys, or the runs-dir shell and its commands
    "setup": 2,
}
EXTRA_PROCESSES = 4  # healthcheck `test -f`, `docker exec sh` and what it runs
PIDS_HEADROOM = 4
PIDS_ROUND = 16
TORCH_ROLES = ("server", "worker", "evaluator")

LOG_DRIVER = "json-file"
LOG_MAX_SIZE = "10m"  # per file; docker rotates at this size
LOG_MAX_FILE = 3  # files kept per container: at most 30 MB of log each
LOG_OPTIONS = {"max-size": LOG_MAX_SIZE, "max-file": str(LOG_MAX_FILE)}


@dataclass(frozen=True)
class Sizes:
    """What the limits depend on: n, d, S, the dataset, the replay window, threads (and,
    per server process, the shards it hosts: the ``shards`` of :func:`memory_limit`)."""

    num_workers: int
    num_params: int
    num_shards: int
    dataset: str
    input_values: int  # C * H * W of one sample
    replay_rounds: int
    torch_threads: int = 1

    @property
    def shard_params(self) -> int:
        """d_s: the largest shard (``common.net.sharding.shard_ranges`` gives the first shards
        the extra values)."""
        return -(-self.num_params // self.num_shards)

    def process_params(self, shards: int = 1) -> int:
        """D: the values a server process hosting ``shards`` shards holds per vector (at
        most ``shards`` times the largest shard)."""
        return shards * self.shard_params

    @property
    def dataset_bytes(self) -> int:
        """A worker's dataset in memory: float32 samples, int64 labels, and the raw bytes
        decoded from (one byte per value) while loading."""
        samples = DATASET_SAMPLES.get(self.dataset, DEFAULT_SAMPLES)
        return samples * (self.input_values * (FLOAT_BYTES + 1) + LABEL_BYTES)


def model_parameters(model: str, dataset: str) -> tuple[int, int]:
    """(d, C * H * W): the parameters of ``model`` on ``dataset``'s inputs, counted on
    torch's meta device (nothing allocated, no data read)."""
    from common.learn.models import count_parameters

    spec = dataset_spec(dataset)
    return (count_parameters(model, spec.input_shape, spec.num_classes),
            math.prod(spec.input_shape))


def sizes_of(cfg: RunConfig, replay_rounds: int, torch_threads: int = 1) -> Sizes:
    """The :class:`Sizes` of a run configuration."""
    d, values = model_parameters(cfg.model, cfg.dataset)
    return Sizes(cfg.num_workers, d, cfg.num_shards, cfg.dataset, values, replay_rounds,
                 torch_threads)


def role_of(service: str) -> str:
    """``server-3`` -> ``server``; ``keys``/``runs-dir`` -> ``setup``."""
    role = service.split("-")[0]
    return role if role in THREADS else "setup"


def memory_estimate(role: str, sizes: Sizes, byzantine: bool = False, shards: int = 1) -> int:
    """Bytes the process of ``role`` holds at its peak (before headroom); see the module.
    ``shards``: the shards a server process hosts (for a proxy: the process it fronts)."""
    f, n, d = FLOAT_BYTES, sizes.num_workers, sizes.num_params
    hosted = sizes.process_params(shards)
    if role == "server":
        return BASE_TORCH + f * hosted * (9 * n + 12)
    if role == "proxy":
        return BASE_PROXY + f * hosted * (7 * n + 3)
    if role == "worker":
        return (BASE_TORCH + sizes.dataset_bytes
                + f * d * (sizes.replay_rounds + 8 + (n if byzantine else 0)))
    if role == "evaluator":
        return BASE_TORCH + sizes.dataset_bytes + f * d * 8
    return BASE_SETUP


def memory_limit(role: str, sizes: Sizes, byzantine: bool = False, shards: int = 1) -> int:
    """The container's memory limit in bytes: ``HEADROOM`` times the estimate, plus the
    tmpfs, rounded up to ``ROUND``."""
    need = HEADROOM * memory_estimate(role, sizes, byzantine, shards) + TMPFS_BYTES
    return math.ceil(need / ROUND) * ROUND


def pids_limit(role: str, torch_threads: int = 1) -> int:
    """The container's limit of processes and threads (see the module)."""
    threads = THREADS[role] + (torch_threads if role in TORCH_ROLES else 0)
    need = PIDS_HEADROOM * (threads + EXTRA_PROCESSES)
    return math.ceil(need / PIDS_ROUND) * PIDS_ROUND


def mebibytes(size: int) -> int:
    """``size`` in MiB (the limits are multiples of 64 MiB)."""
    return size // MiB
