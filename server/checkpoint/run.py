"""A run's checkpoints as its readers find them: the launcher resuming a run, and the
final parameters of a finished one. Each reader knows the shard's exact size, counted
from the run's configuration (``common.learn.models.count_parameters``: nothing built), so
none reads more than the largest legal checkpoint of its shard.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from common.net.sharding import server_blocks, shard_ranges
from server.checkpoint.format import Checkpoint, Expected
from server.checkpoint.reader import load_checkpoint
from server.checkpoint.seal import server_mac_key

if TYPE_CHECKING:
    from common.net.keys import KeyRing
    from common.run.config import RunConfig


def checkpoint_path(out_dir: Path, shard: int) -> Path:
    """Server ``shard``'s checkpoint in ``out_dir``. The name is the one of the ``.npz``
    format before (deployments remove ``shard-*.npz`` between runs); it is no archive."""
    return out_dir / f"shard-{shard}.npz"


def model_size(cfg: RunConfig) -> int:
    """d: the number of parameters of ``cfg``'s model (the length of x^0)."""
    from common.learn.data import dataset_shape
    from common.learn.models import count_parameters

    return count_parameters(cfg.model, *dataset_shape(cfg.dataset))


def process_of(num_shards: int, processes: int | None) -> dict[int, int]:
    """The server process (named by its first shard) hosting each shard when S shards
    are spread over ``processes`` (None: one each), as ``ps-cluster`` spreads them."""
    blocks = server_blocks(num_shards, processes or num_shards)
    return {s: block[0] for block in blocks for s in block}


def expected_checkpoint(cfg: RunConfig, shard: int, *, finite: bool, final: bool = False,
                        d: int | None = None,
                        rule_state: frozenset[str] | None = None) -> Expected:
    """What shard ``shard``'s checkpoint of the run ``cfg`` must be (its size from ``d``,
    the model's, counted from ``cfg`` if not given); ``final``: at the last round."""
    start, stop = shard_ranges(model_size(cfg) if d is None else d, cfg.num_shards)[shard]
    return Expected.of(cfg, shard, size=stop - start, finite=finite, rule_state=rule_state,
                       round=cfg.rounds if final else None)


def read_run_checkpoint(out_dir: Path, cfg: RunConfig, shard: int, keys: KeyRing | None,
                        *, finite: bool, final: bool = False,
                        d: int | None = None, process: int | None = None) -> Checkpoint:
    """Shard ``shard``'s checkpoint in ``out_dir`` of the run ``cfg``, checked with the
    run's keys (None: ``--insecure``, unkeyed digests; ``process``: the server process
    that hosted the shard, by default its own) and against the shard's size (``d``: the
    model's, counted from ``cfg`` if not given); ``final``: at the last round."""
    expect = expected_checkpoint(cfg, shard, finite=finite, final=final, d=d)
    return load_checkpoint(checkpoint_path(out_dir, shard),
                           key=server_mac_key(keys, shard, process), expect=expect)


def final_parameters(out_dir: Path, cfg: RunConfig, keys: KeyRing | None,
                     processes: int | None = None) -> np.ndarray:
    """The whole model vector of the finished run ``cfg`` in ``out_dir``: its shards'
    checkpoints at the last round, each checked with the key of the server process that
    hosted it (S shards over ``processes``; None: one each; no keys: ``--insecure``) and
    its size, in order; ``CheckpointError`` if one is refused. Non-finite values are
    what the run produced, and kept."""
    d = model_size(cfg)
    owner = process_of(cfg.num_shards, processes)
    return np.concatenate([read_run_checkpoint(out_dir, cfg, s, keys, finite=False,
                                               final=True, d=d, process=owner[s]).params
                           for s in range(cfg.num_shards)])


def params_digest(params: np.ndarray) -> str:
    """SHA-256 of the float32 little-endian bytes of a parameter vector."""
    return hashlib.sha256(np.ascontiguousarray(params, dtype="<f4").tobytes()).hexdigest()
