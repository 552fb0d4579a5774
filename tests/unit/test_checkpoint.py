"""Shard checkpoints: atomic replace, fsync, nothing left behind on failure; a MAC (or,
with --insecure, a digest) checked before anything is parsed; every malformed file
refused with one line naming the file and the reason (exit 2: never a crash loop)."""

from __future__ import annotations

import io
import os
import pickle
import stat
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

from common.config import RunConfig
from common.errors import EXIT_CONFIG, ConfigError
from common.keys import KeyRing, create_keys
from server import checkpoint as ck
from server.checkpoint import (
    HEADER_KEYED,
    HEADER_UNKEYED,
    Checkpoint,
    CheckpointError,
    Expected,
    checkpoint_mac_key,
    final_parameters,
    load_checkpoint,
    save_checkpoint,
    server_mac_key,
)
from server.options import ServerOptions

KEY = checkpoint_mac_key(b"s" * 40, 1)
OTHER_KEY = checkpoint_mac_key(b"s" * 40, 0)  # the same secret, another shard
CKPT = Checkpoint(shard=1, round=7, config_hash="0123456789abcdef",
                  params=np.arange(5, dtype=np.float32))
EXPECT = Expected(shard=1, rounds=40, config_hash=CKPT.config_hash, size=5)


def load(path: Path, key: bytes | None = KEY, expect: Expected = EXPECT) -> Checkpoint:
    return load_checkpoint(path, key=key, expect=expect)


def refused(path: Path, reason: str, key: bytes | None = KEY,
            expect: Expected = EXPECT) -> str:
    """The one line ``load`` refuses ``path`` with; it names the file and ``reason``."""
    with pytest.raises(CheckpointError) as info:
        load(path, key, expect)
    line = str(info.value)
    assert "\n" not in line and str(path) in line, line
    assert reason in line, line
    assert isinstance(info.value, ConfigError) and info.value.exit_code == EXIT_CONFIG
    return line


def arrays(**changes: object) -> dict[str, object]:
    """The arrays of ``CKPT`` (round 7, with the round before), changed: None drops one."""
    base: dict[str, object] = {"shard": np.int64(1), "round": np.int64(7),
                               "config_hash": np.array(CKPT.config_hash),
                               "params": CKPT.params, "previous": CKPT.params - 1}
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def npz(**members: object) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **members)
    return buffer.getvalue()


def tagged(payload: bytes, key: bytes | None = KEY) -> bytes:
    """``payload`` with a valid header and tag: what an insider holding the key (or
    anyone, with --insecure) could write; the checks after the MAC must hold too."""
    return ck.seal(payload, key)


def write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "shard-1.npz"
    path.write_bytes(data)
    return path


def npy(shape: tuple[int, ...], descr: str, data: bytes) -> bytes:
    """An .npy member with a header declaring ``shape`` and ``descr`` over ``data``."""
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape!r}, }}"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + data


def raw_zip(members: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def npy_of(value: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, value)
    return buffer.getvalue()


# -- writing ---------------------------------------------------------------------------


def test_save_then_load_round_trips_and_syncs_file_and_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(ck.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    path = tmp_path / "shard-1.npz"
    save_checkpoint(path, CKPT, key=KEY)
    save_checkpoint(path, Checkpoint(1, 8, CKPT.config_hash, CKPT.params + 1,
                                     previous=CKPT.params), key=KEY)
    back = load(path)
    assert (back.shard, back.round, back.config_hash) == (1, 8, CKPT.config_hash)
    np.testing.assert_array_equal(back.params, CKPT.params + 1)
    np.testing.assert_array_equal(back.previous, CKPT.params)
    assert back.params.dtype == np.float32 and back.params.flags.writeable
    assert len(synced) == 4  # the file and its directory, per save
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard-1.npz"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes().startswith(HEADER_KEYED)


def test_an_insecure_checkpoint_carries_an_unkeyed_digest_and_round_trips(tmp_path) -> None:
    path = tmp_path / "shard-1.npz"
    save_checkpoint(path, CKPT, key=None)
    assert path.read_bytes().startswith(HEADER_UNKEYED)
    assert load(path, key=None).round == 7


def test_a_failed_save_keeps_the_previous_checkpoint_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "shard-1.npz"
    save_checkpoint(path, CKPT, key=KEY)

    def disk_full(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ck.os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space"):
        save_checkpoint(path, Checkpoint(1, 9, CKPT.config_hash, CKPT.params), key=KEY)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard-1.npz"]
    monkeypatch.undo()
    assert load(path).round == 7


def test_temporary_files_are_unique_per_writer_private_and_in_the_same_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = []
    real_replace = os.replace

    def replace(src, dst):
        seen.append((Path(src), stat.S_IMODE(os.stat(src).st_mode)))
        real_replace(src, dst)

    monkeypatch.setattr(ck.os, "replace", replace)
    path = tmp_path / "shard-1.npz"
    (tmp_path / "shard-1.npz.tmp").write_bytes(b"another writer's")  # the old fixed name
    save_checkpoint(path, CKPT, key=KEY)
    save_checkpoint(path, CKPT, key=KEY)
    (first, mode1), (second, mode2) = seen
    assert first != second and first.parent == second.parent == tmp_path
    assert first.name.startswith("shard-1.npz.") and first.name.endswith(".tmp")
    assert mode1 == mode2 == 0o600
    assert (tmp_path / "shard-1.npz.tmp").read_bytes() == b"another writer's"


# -- what a server accepts ---------------------------------------------------------------


def test_the_mac_key_is_derived_per_server_never_the_curve_secret(tmp_path: Path) -> None:
    create_keys(tmp_path / "keys", 2, 1)
    ring = KeyRing(tmp_path / "keys")
    secret = ring.pair("server-1")[1]
    key = server_mac_key(ring, 1)
    assert key == checkpoint_mac_key(secret, 1) and len(key) == 32
    assert secret not in key and key != server_mac_key(ring, 0)
    assert server_mac_key(None, 1) is None


def test_rule_state_round_trips_and_a_stateless_run_refuses_it(tmp_path: Path) -> None:
    path = tmp_path / "shard-1.npz"
    center = np.linspace(-1, 1, 5, dtype=np.float32)
    save_checkpoint(path, Checkpoint(1, 7, CKPT.config_hash, CKPT.params,
                                     rule_state={"center": center}), key=KEY)
    np.testing.assert_array_equal(load(path).rule_state["center"], center)
    stateful = Expected(1, 40, CKPT.config_hash, 5, rule_state=frozenset({"center"}))
    assert set(load(path, expect=stateful).rule_state) == {"center"}
    stateless = Expected(1, 40, CKPT.config_hash, 5, rule_state=frozenset())
    refused(path, "unexpected member(s) 'rule_center.npy' (this run's rule keeps no state)",
            expect=stateless)


# -- refusals: the file ----------------------------------------------------------------


def test_an_empty_file_is_refused(tmp_path: Path) -> None:
    refused(write(tmp_path, b""), "the file is empty")


def test_a_truncated_file_is_refused(tmp_path: Path) -> None:
    whole = ck.encode_checkpoint(CKPT, KEY)
    refused(write(tmp_path, whole[:len(whole) // 2]), "MAC mismatch")
    refused(write(tmp_path, whole[:len(HEADER_KEYED) + 10]), "truncated")
    refused(write(tmp_path, whole[:20]), "truncated or malformed header line")


def test_a_file_that_is_not_a_checkpoint_is_refused(tmp_path: Path) -> None:
    refused(write(tmp_path, b"not a checkpoint"), "not a checkpoint: it does not start with "
            "the 'byzps-checkpoint' header")


def test_an_old_format_plain_npz_is_refused_saying_so(tmp_path: Path) -> None:
    refused(write(tmp_path, npz(**arrays())), "an old-format checkpoint (a plain .npz with "
            "no MAC)")


def test_another_format_version_is_refused(tmp_path: Path) -> None:
    data = ck.encode_checkpoint(CKPT, KEY).replace(b"checkpoint 1 ", b"checkpoint 2 ", 1)
    refused(write(tmp_path, data), "format version '2'; this version reads 1")


def test_a_file_larger_than_any_checkpoint_of_the_shard_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "shard-1.npz"
    with path.open("wb") as f:  # sparse: 64 GiB that take no space
        f.truncate(64 << 30)
    monkeypatch.setattr(ck.os, "read", lambda *_: pytest.fail("read a file too large"))
    line = refused(path, f"{64 << 30} bytes, larger than any checkpoint of shard 1 (at most ")
    assert "for its 5 values" in line
    # a reader that does not know the shard's size still has a bound
    unsized = Expected(1, 40, CKPT.config_hash)
    refused(path, "larger than any checkpoint of shard 1", expect=unsized)


def test_a_directory_or_a_fifo_is_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "shard-1.npz").mkdir()
    refused(tmp_path / "shard-1.npz", "not a regular file")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    refused(fifo, "not a regular file")  # and the open did not block


# -- refusals: the MAC -----------------------------------------------------------------


def test_a_flipped_byte_anywhere_is_refused_by_the_mac(tmp_path: Path) -> None:
    whole = ck.encode_checkpoint(CKPT, KEY)
    for at in (len(HEADER_KEYED) + 3, len(HEADER_KEYED) + 40, len(whole) // 2, len(whole) - 1):
        flipped = bytearray(whole)
        flipped[at] ^= 0x01
        refused(write(tmp_path, bytes(flipped)),
                "MAC mismatch: not written with server-1's key")


def test_a_flipped_byte_in_an_insecure_checkpoint_is_refused_by_its_digest(tmp_path) -> None:
    flipped = bytearray(ck.encode_checkpoint(CKPT, None))
    flipped[-30] ^= 0x80
    refused(write(tmp_path, bytes(flipped)), "SHA-256 digest mismatch: the file is torn or "
            "corrupted", key=None)


def test_a_checkpoint_under_another_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "shard-1.npz"
    save_checkpoint(path, CKPT, key=checkpoint_mac_key(b"t" * 40, 1))  # another run's keys
    refused(path, "MAC mismatch")


def test_a_checkpoint_written_by_another_shards_server_is_refused(tmp_path: Path) -> None:
    create_keys(tmp_path / "keys", 2, 1)
    ring = KeyRing(tmp_path / "keys")
    path = tmp_path / "shard-1.npz"
    # server 0's checkpoint, copied over server 1's (as it is, or relabelled shard 1)
    save_checkpoint(path, Checkpoint(0, 7, CKPT.config_hash, CKPT.params),
                    key=server_mac_key(ring, 0))
    refused(path, "MAC mismatch: not written with server-1's key", key=server_mac_key(ring, 1))
    save_checkpoint(path, CKPT, key=OTHER_KEY)
    refused(path, "MAC mismatch", key=KEY)
    # with --insecure there is no key: the shard it holds gives it away
    save_checkpoint(path, Checkpoint(0, 7, CKPT.config_hash, CKPT.params), key=None)
    refused(path, "it holds shard 0, not shard 1", key=None)


def test_a_keyed_server_refuses_an_unkeyed_checkpoint_and_vice_versa(tmp_path: Path) -> None:
    path = tmp_path / "shard-1.npz"
    save_checkpoint(path, CKPT, key=None)
    refused(path, "written without a key (an unkeyed SHA-256 digest, as an --insecure "
            "server writes), but this run has keys")
    save_checkpoint(path, CKPT, key=KEY)
    refused(path, "written with a key (HMAC-SHA256), but this reader has none (--insecure)",
            key=None)


# -- refusals: what a valid tag covers (an insider with the key, or --insecure) -----------


def test_a_bad_zip_behind_a_valid_tag_is_refused(tmp_path: Path) -> None:
    refused(write(tmp_path, tagged(b"PK\x03\x04 certainly not a zip")),
            "its archive is unreadable (BadZipFile")
    whole = npz(**arrays())
    refused(write(tmp_path, tagged(whole[:len(whole) - 30])), "its archive is unreadable")


@pytest.mark.parametrize("key", [KEY, None])
def test_missing_members_are_refused(tmp_path: Path, key: bytes | None) -> None:
    refused(write(tmp_path, tagged(npz(**arrays(params=None)), key)),
            "missing member(s) 'params.npy'", key=key)
    refused(write(tmp_path, tagged(npz(**arrays(shard=None, round=None)), key)),
            "missing member(s) 'shard.npy', 'round.npy'", key=key)


def test_unexpected_members_are_refused(tmp_path: Path) -> None:
    refused(write(tmp_path, tagged(npz(**arrays(extra=np.zeros(5, np.float32))))),
            "unexpected member(s) 'extra.npy'")
    members = {f"{k}.npy": npy_of(np.asarray(v)) for k, v in arrays().items()}
    members["notes.txt"] = b"hello"
    refused(write(tmp_path, tagged(raw_zip(members))), "unexpected member(s) 'notes.txt'")
    refused(write(tmp_path, tagged(npz(**arrays(**{"rule_a-b": np.zeros(5, np.float32)})))),
            "unexpected member(s) 'rule_a-b.npy'")


def test_a_member_twice_is_refused(tmp_path: Path) -> None:
    members = [(f"{k}.npy", npy_of(np.asarray(v))) for k, v in arrays().items()]
    members.append(("params.npy", npy_of(np.full(5, 9, np.float32))))
    buffer = io.BytesIO()
    with pytest.warns(UserWarning), zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members:
            archive.writestr(name, data)
    refused(write(tmp_path, tagged(buffer.getvalue())), "member 'params.npy' appears twice")


def test_compressed_members_are_refused(tmp_path: Path) -> None:
    members = {f"{k}.npy": npy_of(np.asarray(v)) for k, v in arrays().items()}
    refused(write(tmp_path, tagged(raw_zip(members, zipfile.ZIP_DEFLATED))),
            "is compressed (method 8); checkpoints are stored")


class _Boom:
    """Unpickling this runs code: it must never happen."""

    ran = False

    def __reduce__(self):
        return (_Boom._run, ())

    @staticmethod
    def _run() -> None:
        _Boom.ran = True


def test_object_arrays_are_never_loaded(tmp_path: Path) -> None:
    params = np.empty(5, dtype=object)
    params[:] = [_Boom() for _ in range(5)]
    assert pickle.dumps(params)  # a real pickle inside the member
    refused(write(tmp_path, tagged(npz(**arrays(params=params)))),
            "member 'params.npy' holds Python objects (dtype object); never loaded")
    assert not _Boom.ran


def test_wrong_dtypes_are_refused(tmp_path: Path) -> None:
    # float64 values a float32 cannot hold would become inf: refused, never cast
    huge = np.full(5, 1e300, dtype=np.float64)
    refused(write(tmp_path, tagged(npz(**arrays(params=huge)))),
            "member 'params.npy' has dtype float64 ('<f8'), expected float32 ('<f4')")
    refused(write(tmp_path, tagged(npz(**arrays(previous=np.arange(5, dtype=np.int32))))),
            "member 'previous.npy' has dtype int32")
    refused(write(tmp_path, tagged(npz(**arrays(params=CKPT.params.astype(">f4"))))),
            "has dtype >f4 ('>f4'), expected float32")
    refused(write(tmp_path, tagged(npz(**arrays(config_hash=np.int64(3))))),
            "member 'config_hash.npy' is int64 ('<i8') of shape (), expected a string")


@pytest.mark.parametrize("field", ["shard", "round"])
def test_a_non_scalar_or_non_integer_shard_or_round_is_refused(tmp_path: Path,
                                                               field: str) -> None:
    refused(write(tmp_path, tagged(npz(**arrays(**{field: np.array([1, 2])})))),
            f"member '{field}.npy' is int64 ('<i8') of shape (2,), expected an int64 scalar")
    refused(write(tmp_path, tagged(npz(**arrays(**{field: np.float64(1.5)})))),
            f"member '{field}.npy' is float64 ('<f8') of shape (), expected an int64 scalar")
    refused(write(tmp_path, tagged(npz(**arrays(**{field: np.array("1")})))),
            "expected an int64 scalar")


def test_a_declared_shape_larger_than_the_shard_is_refused_before_allocating(
    tmp_path: Path,
) -> None:
    members = {f"{k}.npy": npy_of(np.asarray(v)) for k, v in arrays(previous=None).items()}
    members["params.npy"] = npy((4_000_000_000_000,), "<f4", b"\0" * 64)  # 16 TB declared
    path = write(tmp_path, tagged(raw_zip(members)))
    tracemalloc.start()
    try:
        refused(path, "member 'params.npy' declares shape (4000000000000,), expected (5,): "
                "shard 1 holds 5 values")
        # a reader that does not know the size: the member's bytes bound it
        refused(path, "declares shape (4000000000000,), more values than its",
                expect=Expected(1, 40, CKPT.config_hash))
        assert tracemalloc.get_traced_memory()[1] < 16 << 20
    finally:
        tracemalloc.stop()
    members["params.npy"] = npy((5, 1), "<f4", b"\0" * 20)
    refused(write(tmp_path, tagged(raw_zip(members))), "has shape (5, 1), expected a vector")
    members["params.npy"] = npy((-5,), "<f4", b"")
    refused(write(tmp_path, tagged(raw_zip(members))), "has shape (-5,), expected a vector")


def test_a_member_shorter_than_its_header_declares_is_refused(tmp_path: Path) -> None:
    members = {f"{k}.npy": npy_of(np.asarray(v)) for k, v in arrays(previous=None).items()}
    members["params.npy"] = npy((5,), "<f4", b"\0" * 12)
    refused(write(tmp_path, tagged(raw_zip(members))),
            "member 'params.npy': truncated (12 of its 20 data bytes)")
    members["params.npy"] = npy((5,), "<f4", b"\0" * 24)
    refused(write(tmp_path, tagged(raw_zip(members))), "bytes after its data")


def test_params_of_the_wrong_size_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "shard-1.npz"
    save_checkpoint(path, Checkpoint(1, 7, CKPT.config_hash, np.zeros(6, np.float32)), key=KEY)
    refused(path, "member 'params.npy' declares shape (6,), expected (5,): shard 1 holds 5 "
            "values")
    # a reader that does not know d: all arrays the same size
    refused(write(tmp_path, tagged(npz(**arrays(previous=np.zeros(4, np.float32))))),
            "previous holds 4 values, params 5", expect=Expected(1, 40, CKPT.config_hash))


@pytest.mark.parametrize("member", ["params", "previous", "rule_center"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_refused(tmp_path: Path, member: str, bad: float) -> None:
    values = np.arange(5, dtype=np.float32)
    values[2] = bad
    path = write(tmp_path, tagged(npz(**arrays(**{member: values}))))
    refused(path, f"{member} holds 1 non-finite value(s) (NaN or inf); a server resumes "
            f"only finite state")
    # a reader of a finished run's result takes what the run produced
    kept = load(path, expect=Expected(1, 40, CKPT.config_hash, 5, finite=False))
    assert not np.isfinite(kept.params).all() or member != "params"


@pytest.mark.parametrize("round_", [-1, 41, 2**62])
def test_a_round_outside_the_run_is_refused(tmp_path: Path, round_: int) -> None:
    path = tmp_path / "shard-1.npz"
    save_checkpoint(path, Checkpoint(1, round_, CKPT.config_hash, CKPT.params), key=KEY)
    refused(path, f"round {round_} outside 0..40")


def test_the_round_before_round_zero_is_refused(tmp_path: Path) -> None:
    refused(write(tmp_path, tagged(npz(**arrays(round=np.int64(0)))), ),
            "it holds the parameters of a round before round 0")


def test_another_runs_configuration_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "shard-1.npz"
    save_checkpoint(path, Checkpoint(1, 7, "fedcba9876543210", CKPT.params), key=KEY)
    refused(path, "configuration hash 'fedcba9876543210', this run's is '0123456789abcdef' "
            "(another run's checkpoint)")
    refused(write(tmp_path, tagged(npz(**arrays(config_hash=np.array("x" * 65))))),
            "expected a string of at most 64 characters")


def test_another_shard_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "shard-1.npz"
    save_checkpoint(path, Checkpoint(2, 7, CKPT.config_hash, CKPT.params), key=KEY)
    refused(path, "it holds shard 2, not shard 1")


def test_names_from_the_file_are_quoted_and_short(tmp_path: Path) -> None:
    members = {f"{k}.npy": npy_of(np.asarray(v)) for k, v in arrays().items()}
    members["evil\nname" + "x" * 200] = b""
    line = refused(write(tmp_path, tagged(raw_zip(members))), "unexpected member(s) 'evil\\n")
    assert len(line) < 300


# -- the server and the readers --------------------------------------------------------

CFG = RunConfig(dataset="synthetic", num_workers=3, num_shards=2, rule="marmed",
                rounds=4).validate()


def test_a_server_refuses_a_bad_checkpoint_and_leaves_it_as_it_was(tmp_path: Path) -> None:
    from server.node import build_core

    initial = np.zeros(11, dtype=np.float32)
    path = ck.checkpoint_path(tmp_path, 1)
    save_checkpoint(path, Checkpoint(1, 2, CFG.config_hash, np.ones(5, np.float32),
                                     previous=np.ones(5, np.float32)), key=KEY)
    options = ServerOptions(shard=1, resume=True)
    core, writer = build_core(CFG, options, tmp_path, initial, KEY)
    assert core.state.round == 2
    writer.close(core.snapshot())
    before = path.read_bytes()
    with pytest.raises(CheckpointError, match="MAC mismatch"):
        build_core(CFG, options, tmp_path, initial, OTHER_KEY)
    with pytest.raises(CheckpointError, match="written with a key"):
        build_core(CFG, options, tmp_path, initial)  # the default: --insecure
    assert path.read_bytes() == before
    # the checks the core makes after the file's are named with the file too
    save_checkpoint(path, Checkpoint(1, 2, CFG.config_hash, np.ones(5, np.float32),
                                     rule_state={"center": np.ones(5, np.float32)}), key=KEY)
    with pytest.raises(CheckpointError, match=r"shard-1\.npz refused: unexpected member"):
        build_core(CFG, options, tmp_path, initial, KEY)
    cc = RunConfig(dataset="synthetic", num_workers=3, num_shards=2, q=1,
                   rule="centered-clipping", rounds=4).validate()
    save_checkpoint(path, Checkpoint(1, 2, cc.config_hash, np.ones(5, np.float32),
                                     rule_state={"bogus": np.ones(5, np.float32)}), key=KEY)
    with pytest.raises(CheckpointError, match=r"refused: checkpoint's rule state: "
                       r"centered-clipping state has unknown entries \['bogus'\]"):
        build_core(cc, options, tmp_path, initial, KEY)


def _run(tmp_path: Path, key_of, rounds: int = 4, values=(0.0, 1.0)) -> None:
    for s in range(2):
        save_checkpoint(ck.checkpoint_path(tmp_path, s),
                        Checkpoint(s, rounds, CFG.config_hash,
                                   np.full(6 - s, values[s], dtype=np.float32)),
                        key=key_of(s))


def test_final_parameters_check_each_shard_with_its_servers_key(tmp_path: Path) -> None:
    create_keys(tmp_path / "keys", 2, 3)
    ring = KeyRing(tmp_path / "keys")
    _run(tmp_path, lambda s: server_mac_key(ring, s), values=(0.0, np.nan))
    params = final_parameters(tmp_path, CFG, ring)
    np.testing.assert_array_equal(params[:6], 0.0)
    assert np.isnan(params[6:]).all()  # a diverged run's result is what it is
    with pytest.raises(CheckpointError, match="written with a key"):
        final_parameters(tmp_path, CFG, None)
    _run(tmp_path, lambda s: server_mac_key(ring, 1 - s))
    with pytest.raises(CheckpointError, match=r"shard-0\.npz refused: MAC mismatch"):
        final_parameters(tmp_path, CFG, ring)


def test_final_parameters_of_an_insecure_run_and_of_an_unfinished_one(tmp_path) -> None:
    _run(tmp_path, lambda s: None)
    np.testing.assert_array_equal(final_parameters(tmp_path, CFG, None),
                                  [0] * 6 + [1] * 5)
    _run(tmp_path, lambda s: None, rounds=3)
    with pytest.raises(CheckpointError, match="round 3, not round 4"):
        final_parameters(tmp_path, CFG, None)
    for s in range(2):
        save_checkpoint(ck.checkpoint_path(tmp_path, s),
                        Checkpoint(s, 4, CFG.config_hash, np.zeros(3 + 3 * s, np.float32)),
                        key=None)
    with pytest.raises(CheckpointError, match=r"the shards hold \[3, 6\] values, not a split"):
        final_parameters(tmp_path, CFG, None)


# -- the writer thread -----------------------------------------------------------------


def test_writer_saves_the_newest_in_the_background_and_the_final_one_at_close(
    tmp_path: Path,
) -> None:
    failures = []
    path = tmp_path / "shard-1.npz"
    writer = ck.CheckpointWriter(path, on_failure=lambda: failures.append(1), key=KEY)
    for r in range(5):
        writer.submit(Checkpoint(1, r, CKPT.config_hash, CKPT.params + r))
    writer.close(Checkpoint(1, 9, CKPT.config_hash, CKPT.params + 9))
    back = load(path)
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
    writer = ck.CheckpointWriter(path, on_failure=lambda: failures.append(1), key=KEY)
    writer.submit(CKPT)
    writer.close(CKPT)  # the final save fails too: reported, not raised
    assert len(failures) >= 1 and not list(tmp_path.iterdir())
    full[0] = False
    writer = ck.CheckpointWriter(path, on_failure=lambda: failures.append(1), key=KEY)
    writer.close(CKPT)
    assert load(path).round == 7
