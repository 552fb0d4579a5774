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


def test_save_then_load_round_trips_and_syncs_file_and_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(ck.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    path = tmp_path / "shard-1.npz"
    save_checkpoint(path, CKPT)
    save_checkpoint(path, Checkpoint(1, 8, CKPT.config_hash, CKPT.params + 1))
    back = load_checkpoint(path)
    assert (back.shard, back.round, back.config_hash) == (1, 8, CKPT.config_hash)
    np.testing.assert_array_equal(back.params, CKPT.params + 1)
    assert len(synced) == 4  # the file and its directory, per save
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


def test_writer_saves_the_newest_in_the_background_and_the_final_one_at_close(
    tmp_path: Path,
) -> None:
    failures = []
    path = tmp_path / "shard-1.npz"
    writer = ck.CheckpointWriter(path, on_failure=lambda: failures.append(1))
    for r in range(5):
        writer.submit(Checkpoint(1, r, CKPT.config_hash, CKPT.params + r))
    writer.close(Checkpoint(1, 9, CKPT.config_hash, CKPT.params + 9))
    back = load_checkpoint(path)
    assert back.round == 9 and failures == []
    np.testing.assert_array_equal(back.params, CKPT.params + 9)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard-1.npz"]


def test_writer_failures_are_reported_and_retried_never_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failures = []
    real_savez = ck.np.savez
    full = [True]

    def maybe_full(*args, **kwargs):
        if full[0]:
            raise OSError(24, "Too many open files")
        return real_savez(*args, **kwargs)

    monkeypatch.setattr(ck.np, "savez", maybe_full)
    path = tmp_path / "shard-1.npz"
    writer = ck.CheckpointWriter(path, on_failure=lambda: failures.append(1))
    writer.submit(CKPT)
    writer.close(CKPT)  # the final save fails too: reported, not raised
    assert len(failures) >= 1 and not list(tmp_path.iterdir())
    full[0] = False
    writer = ck.CheckpointWriter(path, on_failure=lambda: failures.append(1))
    writer.close(CKPT)
    assert load_checkpoint(path).round == 7
