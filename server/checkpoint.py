"""Atomic checkpoints of one shard: its parameters and the round they belong to.

A checkpoint is one ``.npz`` file (numpy arrays only, loaded with
``allow_pickle=False``) written to a temporary name and renamed over the old
one, so a crash leaves either the previous or the new checkpoint, never a torn
file. It records the configuration hash: resuming under other settings is
refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.errors import ConfigError


@dataclass(frozen=True)
class Checkpoint:
    """Shard ``shard``'s parameters at the start of round ``round``."""

    shard: int
    round: int
    config_hash: str
    params: np.ndarray


def checkpoint_path(out_dir: Path, shard: int) -> Path:
    return out_dir / f"shard-{shard}.npz"


def save_checkpoint(path: Path, ckpt: Checkpoint) -> None:
    """Write ``ckpt`` to ``path`` atomically."""
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, shard=np.int64(ckpt.shard), round=np.int64(ckpt.round),
             config_hash=np.array(ckpt.config_hash), params=ckpt.params)
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> Checkpoint:
    """Read a checkpoint; ``ConfigError`` naming the file if it is unreadable."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return Checkpoint(
                shard=int(data["shard"]),
                round=int(data["round"]),
                config_hash=str(data["config_hash"]),
                params=np.array(data["params"], dtype=np.float32),
            )
    except (OSError, KeyError, ValueError) as exc:
        raise ConfigError(f"cannot read checkpoint {path}: {exc}") from exc
