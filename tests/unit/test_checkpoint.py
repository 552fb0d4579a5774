"""Shard checkpoints: atomic replace, optional fsync, nothing left behind on failure."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from common.errors import ConfigError
from server import checkpoint as ck
from server.checkpoint import Checkpoint, final_parameters, load_checkpoint, save_checkpoint

CKPT = Checkpoint(shard=1, round=7, config_hash="0123456789abcdef",
                  params=np.arange(5, dtype=np.float32))


@pytest.mark.parametrize("sync", [False, True])
def test_save_then_load_round_trips_and_syncs_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync: bool
) -> None:
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(ck.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    path = tmp_path / "shard-1.npz"
    save_checkpoint(path, CKPT, sync=sync)
    save_checkpoint(path, Checkpoint(1, 8, CKPT.config_hash, CKPT.params + 1), sync=sync)
    back = load_checkpoint(path)
    assert (back.shard, back.round, back.config_hash) == (1, 8, CKPT.config_hash)
    np.testing.assert_array_equal(back.params, CKPT.params + 1)
    assert len(synced) == (4 if sync else 0)  # the file and its directory, per save
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard-1.npz"]


def test_a_failed_save_keeps_the_previous_checkpoint_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "shard-1.npz"
    save_checkpoint(path, CKPT)

    def disk_full(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ck.np, "savez", disk_full)
    with pytest.raises(OSError, match="No space"):
        save_checkpoint(path, Checkpoint(1, 9, CKPT.config_hash, CKPT.params))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard-1.npz"]
    assert load_checkpoint(path).round == 7


def test_unreadable_checkpoint_is_a_configuration_error_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "shard-0.npz"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match=r"shard-0\.npz"):
        load_checkpoint(bad)


def test_final_parameters_concatenate_the_shards_in_order(tmp_path: Path) -> None:
    for s in range(3):
        save_checkpoint(tmp_path / f"shard-{s}.npz",
                        Checkpoint(s, 4, "h", np.full(2, s, dtype=np.float32)))
    np.testing.assert_array_equal(final_parameters(tmp_path, 3), [0, 0, 1, 1, 2, 2])
