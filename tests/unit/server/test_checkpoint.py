"""Shard checkpoints: atomic replace, fsync, nothing left behind on failure; a fixed
binary layout whose table is checked against the run before any array is read, a MAC
(or, with --insecure, a digest) computed while the arrays stream in; every malformed
file refused with one line naming the file and the reason (exit 2: never a crash
loop)."""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import stat
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from common.errors import EXIT_CONFIG, ConfigError
from common.net.keys import KeyRing, create_keys
from common.net.sharding import shard_ranges
from common.run.config import RunConfig
from common.run.model_init import initial_parameters
from server import checkpoint as ck
from server.checkpoint import (
    Checkpoint,
    CheckpointError,
    Expected,
    checkpoint_mac_key,
    final_parameters,
    load_checkpoint,
    model_size,
    read_run_checkpoint,
    save_checkpoint,
    seal,
    server_mac_key,
)
from server.checkpoint.format import ENTRY, FIXED, LINE_KEYED, LINE_UNKEYED
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


def head(entries=(("params", 5), ("previous", 5)), *, shard: int = 1, round_: int = 7,
         config_hash: bytes = CKPT.config_hash.encode(), count: int | None = None,
         key: bytes | None = KEY) -> bytes:
    """A line and table declaring ``entries`` (name, values): anything a writer could
    put there, legal or not."""
    table = FIXED.pack(shard, round_, config_hash, len(entries) if count is None else count)
    for name, values in entries:
        table += ENTRY.pack(name.encode() if isinstance(name, str) else name, values)
    return (LINE_KEYED if key is not None else LINE_UNKEYED) + table


def sealed(head_bytes: bytes, payload: bytes, key: bytes | None = KEY) -> bytes:
    """``head_bytes`` and ``payload`` with a valid tag: what an insider holding the key
    (or anyone, with --insecure) could write; the checks besides the MAC must hold."""
    return head_bytes + seal.tag(key, head_bytes, [payload]) + payload


def floats(*arrays: object) -> bytes:
    return b"".join(np.asarray(a, dtype="<f4").tobytes() for a in arrays)


GOOD = floats(CKPT.params, CKPT.params - 1)  # params and previous


def write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "shard-1.npz"
    path.write_bytes(data)
    return path


# -- writing ---------------------------------------------------------------------------


def test_save_then_load_round_trips_and_syncs_file_and_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(ck.writer.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
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
    assert path.read_bytes().startswith(LINE_KEYED)


def test_the_file_is_the_documented_layout(tmp_path: Path) -> None:
    """Line, table, tag over line + table + arrays, then the raw float32 arrays."""
    path = tmp_path / "shard-1.npz"
    center = np.full(5, 0.5, np.float32)
    save_checkpoint(path, Checkpoint(1, 7, CKPT.config_hash, CKPT.params,
                                     previous=CKPT.params - 1,
                                     rule_state={"center": center}), key=KEY)
    data = path.read_bytes()
    line = b"byzps-checkpoint 2 hmac-sha256\n"
    table = (struct.pack("<Iq64sI", 1, 7, b"0123456789abcdef", 3)
             + struct.pack("<32sQ", b"params", 5) + struct.pack("<32sQ", b"previous", 5)
             + struct.pack("<32sQ", b"rule_center", 5))
    arrays = floats(CKPT.params, CKPT.params - 1, center)
    tag = hmac.new(KEY, line + table + arrays, hashlib.sha256).digest()
    assert data == line + table + tag + arrays
    save_checkpoint(path, CKPT, key=None)
    data = path.read_bytes()
    line = b"byzps-checkpoint 2 sha256\n"
    table = (struct.pack("<Iq64sI", 1, 7, b"0123456789abcdef", 1)
             + struct.pack("<32sQ", b"params", 5))
    assert data == (line + table + hashlib.sha256(line + table + floats(CKPT.params)).digest()
                    + floats(CKPT.params))


def test_an_insecure_checkpoint_carries_an_unkeyed_digest_and_round_trips(tmp_path) -> None:
    path = tmp_path / "shard-1.npz"
    save_checkpoint(path, CKPT, key=None)
    assert path.read_bytes().startswith(LINE_UNKEYED)
    assert load(path, key=None).round == 7


def test_a_failed_save_keeps_the_previous_checkpoint_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "shard-1.npz"
    save_checkpoint(path, CKPT, key=KEY)

    def disk_full(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ck.writer.os, "fsync", disk_full)
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

    monkeypatch.setattr(ck.writer.os, "replace", replace)
    path = tmp_path / "shard-1.npz"
    (tmp_path / "shard-1.npz.tmp").write_bytes(b"another writer's")  # the old fixed name
    save_checkpoint(path, CKPT, key=KEY)
    save_checkpoint(path, CKPT, key=KEY)
    (first, mode1), (second, mode2) = seen
    assert first != second and first.parent == second.parent == tmp_path
    assert first.name.startswith("shard-1.npz.") and first.name.endswith(".tmp")
    assert mode1 == mode2 == 0o600
    assert (tmp_path / "shard-1.npz.tmp").read_bytes() == b"another writer's"


def test_saving_and_loading_hold_about_one_copy_of_the_state(tmp_path: Path) -> None:
    """The arrays are hashed and written where they are, and read straight into the
    arrays returned: no archive, no copy of the file in memory."""
    size = 1 << 20
    state = Checkpoint(1, 7, CKPT.config_hash, np.ones(size, np.float32),
                       previous=np.zeros(size, np.float32))
    path = tmp_path / "shard-1.npz"
    state_bytes = 2 * 4 * size  # 8 MiB
    tracemalloc.start()
    try:
        save_checkpoint(path, state, key=KEY)
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
        tracemalloc.reset_peak()
        back = load(path, expect=Expected(1, 40, CKPT.config_hash, size))
        assert tracemalloc.get_traced_memory()[1] < state_bytes + (1 << 20)
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(back.params, state.params)


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
    refused(path, "unexpected array 'rule_center' (this run's rule keeps no state)",
            expect=stateless)
    other = Expected(1, 40, CKPT.config_hash, 5, rule_state=frozenset({"momentum"}))
    refused(path, "unexpected array 'rule_center' (this run's rule keeps momentum)",
            expect=other)


# -- refusals: the file ----------------------------------------------------------------


def test_an_empty_file_is_refused(tmp_path: Path) -> None:
    refused(write(tmp_path, b""), "the file is empty")


def test_a_truncated_file_is_refused_before_its_arrays_are_read(tmp_path: Path) -> None:
    whole = ck.encode_checkpoint(CKPT, KEY)
    refused(write(tmp_path, whole[:-1]), f"truncated: {len(whole) - 1} bytes, its header "
            f"declares {len(whole)}")
    refused(write(tmp_path, whole[:len(LINE_KEYED) + 10]), "truncated: ")
    refused(write(tmp_path, whole[:20]), "truncated or malformed header line")


def test_a_file_larger_than_its_header_declares_is_refused(tmp_path: Path) -> None:
    whole = ck.encode_checkpoint(CKPT, KEY)
    refused(write(tmp_path, whole + b"\0"), f"{len(whole) + 1} bytes, more than the "
            f"{len(whole)} its header declares")


def test_a_file_that_is_not_a_checkpoint_is_refused(tmp_path: Path) -> None:
    refused(write(tmp_path, b"not a checkpoint"), "not a checkpoint: it does not start with "
            "the 'byzps-checkpoint' header")
    refused(write(tmp_path, b"byzps-checkpoint 2 hmac-sha256 extra\n" + b"\0" * 200),
            "malformed header line")
    refused(write(tmp_path, b"byzps-checkpoint 2 md5\n" + b"\0" * 200),
            "unknown integrity check 'md5'")


def test_an_old_format_plain_npz_is_refused_saying_so(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, shard=np.int64(1), round=np.int64(7), params=CKPT.params)
    refused(write(tmp_path, buffer.getvalue()), "an old-format checkpoint (a plain .npz "
            "with no MAC)")


def test_a_version_1_checkpoint_an_npz_behind_a_mac_is_refused_saying_so(tmp_path) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, shard=np.int64(1), round=np.int64(7), params=CKPT.params)
    line = b"byzps-checkpoint 1 hmac-sha256\n"
    data = line + hmac.new(KEY, line + buffer.getvalue(), hashlib.sha256).digest()
    refused(write(tmp_path, data + buffer.getvalue()), "format version '1' (an .npz "
            "archive behind a MAC), which this version does not resume")


def test_another_format_version_is_refused(tmp_path: Path) -> None:
    data = ck.encode_checkpoint(CKPT, KEY).replace(b"checkpoint 2 ", b"checkpoint 3 ", 1)
    refused(write(tmp_path, data), "format version '3'; this version reads 2")


def test_a_file_larger_than_any_checkpoint_of_the_shard_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "shard-1.npz"
    with path.open("wb") as f:  # sparse: 64 GiB that take no space, behind a valid line
        f.write(LINE_KEYED)
        f.truncate(64 << 30)
    monkeypatch.setattr(ck.reader.os, "fdopen", lambda *_a, **_k: pytest.fail("read it"))
    line = refused(path, f"{64 << 30} bytes, larger than any checkpoint of shard 1 (at most ")
    assert "for its 5 values" in line


def test_a_directory_or_a_fifo_is_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "shard-1.npz").mkdir()
    refused(tmp_path / "shard-1.npz", "not a regular file")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    refused(fifo, "not a regular file")  # and the open did not block


# -- refusals: the MAC -----------------------------------------------------------------


def test_a_flipped_byte_in_the_table_tag_or_arrays_is_refused_by_the_mac(tmp_path) -> None:
    whole = ck.encode_checkpoint(CKPT, KEY)
    table = len(LINE_KEYED)
    for at in (table + 4,  # the round: 7 becomes 6, a round of the run
               table + FIXED.size + ENTRY.size + 3,  # the tag
               len(whole) - 10, len(whole) - 1):  # the parameters
        flipped = bytearray(whole)
        flipped[at] ^= 0x01
        refused(write(tmp_path, bytes(flipped)),
                "MAC mismatch: not written with server-1's key")


def test_a_flipped_byte_in_an_insecure_checkpoint_is_refused_by_its_digest(tmp_path) -> None:
    flipped = bytearray(ck.encode_checkpoint(CKPT, None))
    flipped[-3] ^= 0x80
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
    # server 0's checkpoint copied over server 1's: its table says so
    save_checkpoint(path, Checkpoint(0, 7, CKPT.config_hash, CKPT.params),
                    key=server_mac_key(ring, 0))
    refused(path, "it holds shard 0, not shard 1", key=server_mac_key(ring, 1))
    # relabelled shard 1, it is not under server 1's key
    save_checkpoint(path, CKPT, key=OTHER_KEY)
    refused(path, "MAC mismatch: not written with server-1's key", key=KEY)
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


@pytest.mark.parametrize("key", [KEY, None])
def test_a_missing_params_array_is_refused(tmp_path: Path, key: bytes | None) -> None:
    refused(write(tmp_path, sealed(head([("previous", 5)], key=key), floats(CKPT.params),
                                   key)),
            "missing array 'params'", key=key)


def test_unexpected_arrays_are_refused(tmp_path: Path) -> None:
    for name in ("extra", "rule_a-b", "params.npy", ""):
        entries = [("params", 5), (name, 5)]
        refused(write(tmp_path, sealed(head(entries), GOOD)), f"unexpected array {name!r}")


def test_an_array_twice_is_refused(tmp_path: Path) -> None:
    refused(write(tmp_path, sealed(head([("params", 5), ("params", 5)]), GOOD)),
            "array 'params' appears twice")


def test_more_arrays_than_a_checkpoint_holds_are_refused_before_reading_them(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, sealed(head([], count=2**32 - 1), b""))
    refused(path, "it declares 4294967295 arrays; a checkpoint of this run holds 1 to 6")
    stateless = Expected(1, 40, CKPT.config_hash, 5, rule_state=frozenset())
    entries = [("params", 5), ("previous", 5), ("rule_x", 5)]
    refused(write(tmp_path, sealed(head(entries), b"")),  # its arrays would be too large
            "it declares 3 arrays; a checkpoint of this run holds 1 to 2", expect=stateless)
    refused(write(tmp_path, sealed(head([], count=0), b"")), "it declares 0 arrays")


def test_a_declared_size_other_than_the_shards_is_refused_before_allocating(
    tmp_path: Path,
) -> None:
    # 16 TB declared: refused from the table, nothing allocated or read
    path = write(tmp_path, sealed(head([("params", 4_000_000_000_000)]), b"\0" * 64))
    tracemalloc.start()
    try:
        refused(path, "array 'params' declares 4000000000000 values, expected 5: shard 1 "
                "holds 5 values")
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()
    refused(write(tmp_path, sealed(head([("params", 5), ("previous", 4)]), GOOD[:-4])),
            "array 'previous' declares 4 values, expected 5")
    path = tmp_path / "shard-1.npz"
    save_checkpoint(path, Checkpoint(1, 7, CKPT.config_hash, np.zeros(6, np.float32)), key=KEY)
    refused(path, "array 'params' declares 6 values, expected 5: shard 1 holds 5 values")


def test_float64_values_where_float32_are_expected_are_refused(tmp_path: Path) -> None:
    """The layout has no dtype to lie about: values are float32 by definition. A writer
    that put float64 there (1e300 would be inf as float32) writes twice the bytes its
    table declares, and the file's size gives it away; float64 bytes that happen to fit
    a declared float32 size are just (finite or not) float32 values, checked as such."""
    huge = np.full(5, 1e300, dtype="<f8").tobytes()
    refused(write(tmp_path, sealed(head([("params", 5)]), huge)),
            f"more than the {len(head([('params', 5)])) + 32 + 20} its header declares")


@pytest.mark.parametrize("name", ["params", "previous", "rule_center"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_refused(tmp_path: Path, name: str, bad: float) -> None:
    values = np.arange(5, dtype=np.float32)
    values[2] = bad
    arrays = {"params": CKPT.params, "previous": CKPT.params, "rule_center": CKPT.params}
    arrays[name] = values
    path = write(tmp_path, sealed(head([(n, 5) for n in arrays]), floats(*arrays.values())))
    refused(path, f"{name} holds 1 non-finite value(s) (NaN or inf); a server resumes "
            f"only finite state")
    # a reader of a finished run's result takes what the run produced
    kept = load(path, expect=Expected(1, 40, CKPT.config_hash, 5, finite=False))
    assert not np.isfinite(kept.params).all() or name != "params"


@pytest.mark.parametrize("round_", [-1, 41, 2**62])
def test_a_round_outside_the_run_is_refused(tmp_path: Path, round_: int) -> None:
    path = tmp_path / "shard-1.npz"
    save_checkpoint(path, Checkpoint(1, round_, CKPT.config_hash, CKPT.params), key=KEY)
    refused(path, f"round {round_} outside 0..40")


def test_the_round_before_round_zero_is_refused(tmp_path: Path) -> None:
    refused(write(tmp_path, sealed(head(round_=0), GOOD)),
            "it holds the parameters of a round before round 0")


def test_another_runs_configuration_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "shard-1.npz"
    save_checkpoint(path, Checkpoint(1, 7, "fedcba9876543210", CKPT.params), key=KEY)
    refused(path, "configuration hash 'fedcba9876543210', this run's is '0123456789abcdef' "
            "(another run's checkpoint)")
    refused(write(tmp_path, sealed(head(config_hash=b"x" * 64), GOOD)),
            "configuration hash 'xxxx")
    refused(write(tmp_path, sealed(head(config_hash=b"0123\n\xff"), GOOD)),
            "configuration hash '0123\\n\\xff' is not printable ASCII")
    with pytest.raises(ValueError, match="does not fit a checkpoint field of 64 bytes"):
        save_checkpoint(path, Checkpoint(1, 7, "x" * 65, CKPT.params), key=KEY)


def test_another_shard_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "shard-1.npz"
    save_checkpoint(path, Checkpoint(2, 7, CKPT.config_hash, CKPT.params), key=KEY)
    refused(path, "it holds shard 2, not shard 1")


def test_names_from_the_file_are_quoted_and_short(tmp_path: Path) -> None:
    entries = [("params", 5), (b"evil\nname" + b"x" * 23, 5)]
    line = refused(write(tmp_path, sealed(head(entries), GOOD)),
                   "an array name 'evil\\nname")
    assert len(line) < 300


# -- the server and the readers --------------------------------------------------------

CFG = RunConfig(dataset="synthetic", num_workers=3, num_shards=2, rule="marmed",
                rounds=4).validate()


def test_the_model_size_is_counted_without_building_the_model() -> None:
    assert model_size(CFG) == initial_parameters(CFG).size == 118_282


def test_a_server_refuses_a_bad_checkpoint_and_leaves_it_as_it_was(tmp_path: Path) -> None:
    from server.node import build_core

    initial = np.zeros(11, dtype=np.float32)
    path = ck.checkpoint_path(tmp_path, 1)
    save_checkpoint(path, Checkpoint(1, 2, CFG.config_hash, np.ones(5, np.float32),
                                     previous=np.ones(5, np.float32)), key=KEY)
    options = ServerOptions(shard=1, resume=True)
    core, writer = build_core(CFG, options, tmp_path, initial, {1: KEY})
    assert core.state.round == 2
    writer.close(core.snapshot())
    before = path.read_bytes()
    with pytest.raises(CheckpointError, match="MAC mismatch"):
        build_core(CFG, options, tmp_path, initial, {1: OTHER_KEY})
    with pytest.raises(CheckpointError, match="written with a key"):
        build_core(CFG, options, tmp_path, initial)  # the default: --insecure
    with pytest.raises(CheckpointError, match="'params' declares 5 values, expected 6"):
        build_core(CFG, options, tmp_path, np.zeros(13, np.float32), {1: KEY})  # shard 1: 6
    assert path.read_bytes() == before
    # the checks the core makes after the file's are named with the file too
    save_checkpoint(path, Checkpoint(1, 2, CFG.config_hash, np.ones(5, np.float32),
                                     rule_state={"center": np.ones(5, np.float32)}), key=KEY)
    with pytest.raises(CheckpointError, match=r"shard-1\.npz refused: unexpected array"):
        build_core(CFG, options, tmp_path, initial, {1: KEY})
    cc = RunConfig(dataset="synthetic", num_workers=3, num_shards=2, q=1,
                   rule="centered-clipping", rounds=4).validate()
    save_checkpoint(path, Checkpoint(1, 2, cc.config_hash, np.ones(5, np.float32),
                                     rule_state={"bogus": np.ones(5, np.float32)}), key=KEY)
    with pytest.raises(CheckpointError, match=r"refused: checkpoint's rule state: "
                       r"centered-clipping state has unknown entries \['bogus'\]"):
        build_core(cc, options, tmp_path, initial, {1: KEY})


SIZES = [b - a for a, b in shard_ranges(model_size(CFG), CFG.num_shards)]


def _run(tmp_path: Path, key_of, rounds: int = 4, values=(0.0, 1.0), sizes=SIZES) -> None:
    for s in range(2):
        save_checkpoint(ck.checkpoint_path(tmp_path, s),
                        Checkpoint(s, rounds, CFG.config_hash,
                                   np.full(sizes[s], values[s], dtype=np.float32)),
                        key=key_of(s))


def test_final_parameters_check_each_shard_with_its_servers_key(tmp_path: Path) -> None:
    create_keys(tmp_path / "keys", 2, 3)
    ring = KeyRing(tmp_path / "keys")
    _run(tmp_path, lambda s: server_mac_key(ring, s), values=(0.0, np.nan))
    params = final_parameters(tmp_path, CFG, ring)
    assert params.size == model_size(CFG)
    np.testing.assert_array_equal(params[:SIZES[0]], 0.0)
    assert np.isnan(params[SIZES[0]:]).all()  # a diverged run's result is what it is
    with pytest.raises(CheckpointError, match="written with a key"):
        final_parameters(tmp_path, CFG, None)
    _run(tmp_path, lambda s: server_mac_key(ring, 1 - s))
    with pytest.raises(CheckpointError, match=r"shard-0\.npz refused: MAC mismatch"):
        final_parameters(tmp_path, CFG, ring)


def test_final_parameters_of_an_insecure_run_and_of_an_unfinished_one(tmp_path) -> None:
    _run(tmp_path, lambda s: None)
    np.testing.assert_array_equal(final_parameters(tmp_path, CFG, None),
                                  [0] * SIZES[0] + [1] * SIZES[1])
    _run(tmp_path, lambda s: None, rounds=3)
    with pytest.raises(CheckpointError, match="round 3, not round 4"):
        final_parameters(tmp_path, CFG, None)
    _run(tmp_path, lambda s: None, sizes=(3, 6))  # not this model's shards
    with pytest.raises(CheckpointError, match=rf"shard-0\.npz refused: array 'params' "
                       rf"declares 3 values, expected {SIZES[0]}"):
        final_parameters(tmp_path, CFG, None)


def test_the_launchers_reader_knows_the_shard_size_and_bounds_what_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run(tmp_path, lambda s: None, rounds=2)
    assert read_run_checkpoint(tmp_path, CFG, 1, None, finite=True).params.size == SIZES[1]
    path = ck.checkpoint_path(tmp_path, 1)
    with path.open("wb") as f:  # sparse: 8 GiB that take no space
        f.write(LINE_UNKEYED)
        f.truncate(8 << 30)
    monkeypatch.setattr(ck.reader.os, "fdopen", lambda *_a, **_k: pytest.fail("read it"))
    limit = Expected.of(CFG, 1, SIZES[1]).max_file_bytes()
    assert limit < 7 * 4 * SIZES[1]  # params, previous and 4 rule states, plus the table
    with pytest.raises(CheckpointError, match=rf"larger than any checkpoint of shard 1 "
                       rf"\(at most {limit} bytes for its {SIZES[1]} values\)"):
        read_run_checkpoint(tmp_path, CFG, 1, None, finite=True)


# -- the writer thread -----------------------------------------------------------------


def test_writer_saves_the_newest_in_the_background_and_the_final_one_at_close(
    tmp_path: Path,
) -> None:
    failures = []
    path = tmp_path / "shard-1.npz"
    writer = ck.CheckpointWriter(ck.GroupFiles(tmp_path, (1,), {1: KEY}),
                                 on_failure=lambda: failures.append(1))
    for r in range(5):
        writer.submit([Checkpoint(1, r, CKPT.config_hash, CKPT.params + r)])
    writer.close([Checkpoint(1, 9, CKPT.config_hash, CKPT.params + 9)])
    back = load(path)
    assert back.round == 9 and failures == []
    np.testing.assert_array_equal(back.params, CKPT.params + 9)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard-1.npz"]


def test_writer_failures_are_reported_and_retried_never_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failures = []
    real_mkstemp = ck.writer.tempfile.mkstemp
    full = [True]

    def maybe_full(*args, **kwargs):
        if full[0]:
            raise OSError(24, "Too many open files")
        return real_mkstemp(*args, **kwargs)

    monkeypatch.setattr(ck.writer.tempfile, "mkstemp", maybe_full)
    path = tmp_path / "shard-1.npz"
    files = ck.GroupFiles(tmp_path, (1,), {1: KEY})
    writer = ck.CheckpointWriter(files, on_failure=lambda: failures.append(1))
    writer.submit([CKPT])
    writer.close([CKPT])  # the final save fails too: reported, not raised
    assert len(failures) >= 1 and not list(tmp_path.iterdir())
    full[0] = False
    writer = ck.CheckpointWriter(files, on_failure=lambda: failures.append(1))
    writer.close([CKPT])
    assert load(path).round == 7
