"""Atomic checkpoints of one shard: its parameters and the round they belong to.

A checkpoint is one ``.npz`` file (numpy arrays only, loaded with
``allow_pickle=False``) written to a temporary name and renamed over the old one: a
process that dies at any moment leaves either the previous or the new checkpoint,
never a torn file. That survives the process, not the machine: with ``sync`` the file
is fsynced before the rename and the directory after it, so a power cut leaves the
previous or the new checkpoint too. The server saves before it answers the round's
pushes, so syncing lengthens every round (measured under the quick-start load: median
4-5 ms, p90 10 ms per save, about a tenth of a round); it is therefore an option
(``--checkpoint-sync``). A failed write removes its temporary file. A checkpoint
records the configuration hash: resuming under other settings is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
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


def save_checkpoint(path: Path, ckpt: Checkpoint, sync: bool = False) -> None:
    """Write ``ckpt`` to ``path`` atomically (durably with ``sync``); ``OSError`` if it
    cannot, leaving no temporary file behind."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("wb") as f:
            np.savez(f, shard=np.int64(ckpt.shard), round=np.int64(ckpt.round),
                     config_hash=np.array(ckpt.config_hash), params=ckpt.params)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if sync:
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


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


def params_digest(params: np.ndarray) -> str:
    """SHA-256 of the float32 little-endian bytes of a parameter vector."""
    return hashlib.sha256(np.ascontiguousarray(params, dtype="<f4").tobytes()).hexdigest()


def final_parameters(out_dir: Path, num_shards: int) -> np.ndarray:
    """The whole model vector of a finished run: its shards' checkpoints, in order."""
    return np.concatenate([load_checkpoint(checkpoint_path(out_dir, s)).params
                           for s in range(num_shards)])
