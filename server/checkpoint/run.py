"""A run's checkpoints as its readers find them: the launcher resuming a run, and the
final parameters of a finished one. Each reader knows the shard's exact size, counted
from the run's configuration (``common.models.count_parameters``: nothing built), so
none reads more than the largest legal checkpoint of its shard.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from common.sharding import shard_ranges
from server.checkpoint.format import Checkpoint, Expected
from server.checkpoint.reader import load_checkpoint
from server.checkpoint.seal import server_mac_key

if TYPE_CHECKING:
    from common.config import RunConfig
    from common.keys import KeyRing


def checkpoint_path(out_dir: Path, shard: int) -> Path:
    """Server ``shard``'s checkpoint in ``out_dir``. The name is the one of the ``.npz``
    format before (deployments remove ``shard-*.npz`` between runs); it is no archive."""
    return out_dir / f"shard-{shard}.npz"


def model_size(cfg: RunConfig) -> int:
    """d: the number of parameters of ``cfg``'s model (the length of x^0)."""
    from common.data import dataset_shape
    from common.models import count_parameters

    return count_parameters(cfg.model, *dataset_shape(cfg.dataset))


def read_run_checkpoint(out_dir: Path, cfg: RunConfig, shard: int, keys: KeyRing | None,
                        *, finite: bool, final: bool = False,
                        d: int | None = None) -> Checkpoint:
    """Shard ``shard``'s checkpoint in ``out_dir`` of the run ``cfg``, checked with the
    run's keys (None: ``--insecure``, unkeyed digests) and against the shard's size
    (``d``: the model's, counted from ``cfg`` if not given); ``final``: at the last
    round."""
    start, stop = shard_ranges(model_size(cfg) if d is None else d, cfg.num_shards)[shard]
    expect = Expected.of(cfg, shard, size=stop - start, finite=finite,
                         round=cfg.rounds if final else None)
    return load_checkpoint(checkpoint_path(out_dir, shard), key=server_mac_key(keys, shard),
                           expect=expect)


def final_parameters(out_dir: Path, cfg: RunConfig, keys: KeyRing | None) -> np.ndarray:
    """The whole model vector of the finished run ``cfg`` in ``out_dir``: its shards'
    checkpoints at the last round, each checked with its server's key (None:
    ``--insecure``) and size, in order; ``CheckpointError`` if one is refused.
    Non-finite values are what the run produced, and kept."""
    d = model_size(cfg)
    return np.concatenate([read_run_checkpoint(out_dir, cfg, s, keys, finite=False,
                                               final=True, d=d).params
                           for s in range(cfg.num_shards)])


def params_digest(params: np.ndarray) -> str:
    """SHA-256 of the float32 little-endian bytes of a parameter vector."""
    return hashlib.sha256(np.ascontiguousarray(params, dtype="<f4").tobytes()).hexdigest()
