"""Authenticated, atomic checkpoints of one shard: its parameters, the round they belong
to, and the state a stateful rule carries between rounds (centered clipping's previous
aggregate, saved as ``rule_<name>`` arrays).

File format (``shard-<s>.npz`` in the server's ``--out-dir``)::

    b"byzps-checkpoint 1 hmac-sha256\\n"   the header line (or ``... 1 sha256\\n``)
    32 bytes                              the tag over the header line and the payload
    payload                               an uncompressed .npz archive (numpy arrays)

* With keys the tag is HMAC-SHA256 under a key derived from the server's CURVE secret
  (:func:`checkpoint_mac_key`: an HMAC of a label naming the purpose and the shard, so
  the CURVE key itself never keys anything else): a server resumes only a checkpoint
  written with its own key. A file written by another shard's server, by another run's
  keys, or by anyone without the key (a Byzantine insider, a compromised container
  that can write the output directory) is refused.
* With ``--insecure`` there is no secret: the tag is a plain SHA-256 of the same bytes.
  It detects a torn or corrupted file, **not forgery**: anyone who can write the
  directory can write a file that passes it. A keyed reader refuses such a file, and an
  unkeyed reader refuses a keyed one (it cannot check it).

The tag is checked before anything in the file is parsed; the size of the file is
checked (against the largest legal checkpoint of the shard) before it is read. Only
then is the archive opened, and each member's ``.npy`` header read and checked (name,
dtype, shape) before its data is: a header declaring 4e12 values allocates nothing.
Object arrays are never loaded (no pickle). What the loader expects (shard, its size,
the run's rounds and configuration hash) comes from an :class:`Expected`, so every
refusal says what was expected. Every refusal is a :class:`CheckpointError`, a
``ConfigError`` (exit 2, one line naming the file and the reason): a supervisor does not
restart a server that refused its checkpoint (no crash loop).

What the MAC cannot do: it does not stop an insider who can delete the file (the server
then starts at round 0) or put back an *older* checkpoint of the same server and run
(a rollback: within the workers' ``--replay-rounds`` they replay it as after a crash,
with the same result; beyond it they stop with a peer error). A proxy test tool holds
the key of the server it impersonates, so it could forge that server's checkpoints;
deployments have no proxies.

Writing: the file is written to a temporary file unique to the writer
(``tempfile.mkstemp`` in the same directory, mode 0600), fsynced, renamed over the old
one, and the directory fsynced: a process or a machine that dies at any moment leaves
either the previous or the new checkpoint, never a torn file. A failed write (a full
disk, no file descriptor left) removes its temporary file. The file is mode 0600.

Syncing costs milliseconds (measured under the quick-start load: median 4-5 ms, p90
10 ms per save, about a tenth of a round), so a server hands its checkpoints to a
:class:`CheckpointWriter` thread and never waits for one: the writer saves the newest
checkpoint handed to it (skipping any it had no time for), and at exit the last one is
written before the process ends. A resumed server may therefore be a round or two
behind its workers, which replay what it lacks.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import io
import logging
import os
import re
import stat
import tempfile
import threading
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from common.errors import ConfigError
from common.sharding import shard_ranges

if TYPE_CHECKING:
    from common.config import RunConfig
    from common.keys import KeyRing

log = logging.getLogger("ps.checkpoint")

MAGIC = b"byzps-checkpoint"
VERSION = b"1"
KEYED = b"hmac-sha256"
UNKEYED = b"sha256"
HEADER_KEYED = MAGIC + b" " + VERSION + b" " + KEYED + b"\n"
HEADER_UNKEYED = MAGIC + b" " + VERSION + b" " + UNKEYED + b"\n"
HEADER_MAX = 64  # a header line longer than this is not one of ours
TAG_BYTES = 32
MAC_LABEL = b"byzps/checkpoint-mac/v1/server-"

RULE_STATE_PREFIX = "rule_"
REQUIRED = ("shard", "round", "config_hash", "params")
MAX_RULE_STATES = 4  # rule_<name> arrays a checkpoint may hold
_RULE_STATE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}", re.ASCII)
MAX_HASH_CHARS = 64
# readers that do not know the shard's size (the launcher) accept at most this many
# values per array (1 GiB of float32), and refuse larger files before reading them
MAX_SHARD_VALUES = 1 << 28
# per member: zip local and central headers (with zip64 extras), its name, .npy header
MEMBER_SLACK = 1024
ARCHIVE_SLACK = 1024  # the zip's end records
NPY_HEADER_MAX = 4096

FLOAT = np.dtype("<f4")
INT = np.dtype("<i8")


class CheckpointError(ConfigError):
    """A checkpoint this process refuses to use (exit 2; never restarted into a loop)."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"checkpoint {path} refused: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class Checkpoint:
    """Shard ``shard``'s parameters at the start of round ``round``."""

    shard: int
    round: int
    config_hash: str
    params: np.ndarray
    # the parameters of the round before (None at round 0): a resumed server still
    # serves them, so workers can finish that round on a shard that lags by one
    previous: np.ndarray | None = None
    # the rule's state at the start of round ``round`` (``Rule.get_state``), by name
    rule_state: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class Expected:
    """What a checkpoint of this run and shard must hold; every refusal names it.

    ``size``: the shard's number of values (None: a reader that does not know d; any
    size up to ``MAX_SHARD_VALUES``, the same for every array). ``rule_state``: the
    names of the rule's state arrays (None: any, up to ``MAX_RULE_STATES``; empty: a
    rule that keeps none). ``finite``: refuse NaN and inf (a server resumes only finite
    state; readers of a finished run's result accept what the run produced).
    ``round``: the exact round required (None: any in 0..rounds).
    """

    shard: int
    rounds: int
    config_hash: str
    size: int | None = None
    rule_state: frozenset[str] | None = None
    finite: bool = True
    round: int | None = None

    @classmethod
    def of(cls, cfg: RunConfig, shard: int, size: int | None = None,
           rule_state: frozenset[str] | None = None, finite: bool = True,
           round: int | None = None) -> Expected:
        """The expectation of shard ``shard`` of the run ``cfg``."""
        return cls(shard=shard, rounds=cfg.rounds, config_hash=cfg.config_hash, size=size,
                   rule_state=rule_state, finite=finite, round=round)

    def max_values(self) -> int:
        return self.size if self.size is not None else MAX_SHARD_VALUES

    def max_file_bytes(self) -> int:
        """The largest legal checkpoint file of this shard, in bytes."""
        states = (MAX_RULE_STATES if self.rule_state is None
                  else len(self.rule_state))
        arrays = 2 + states  # params, previous, the rule's state
        members = len(REQUIRED) + 1 + states
        return (HEADER_MAX + TAG_BYTES + ARCHIVE_SLACK + members * MEMBER_SLACK
                + arrays * FLOAT.itemsize * self.max_values()
                + 2 * INT.itemsize + 4 * MAX_HASH_CHARS)


def checkpoint_path(out_dir: Path, shard: int) -> Path:
    return out_dir / f"shard-{shard}.npz"


def checkpoint_mac_key(secret: bytes, shard: int) -> bytes:
    """The MAC key of server ``shard``'s checkpoints, derived from its CURVE secret by
    a labelled hash (HMAC-SHA256 of ``MAC_LABEL + shard``): never the CURVE key itself."""
    return hmac.new(secret, MAC_LABEL + str(shard).encode("ascii"), hashlib.sha256).digest()


def server_mac_key(keys: KeyRing | None, shard: int) -> bytes | None:
    """The checkpoint MAC key of server ``shard`` from the run's key ring (its
    ``server-<shard>`` secret); None without keys (``--insecure``: unkeyed digests)."""
    if keys is None:
        return None
    return checkpoint_mac_key(keys.pair(f"server-{shard}")[1], shard)


def _tag(key: bytes | None, header: bytes, payload: bytes | memoryview) -> bytes:
    digest = hashlib.sha256(header) if key is None else hmac.new(key, header, hashlib.sha256)
    digest.update(payload)
    return digest.digest()


def _archive(ckpt: Checkpoint) -> io.BytesIO:
    """The .npz archive of ``ckpt``: numpy arrays of fixed dtypes, stored uncompressed."""
    arrays: dict[str, np.ndarray] = {
        "shard": np.asarray(ckpt.shard, dtype=INT),
        "round": np.asarray(ckpt.round, dtype=INT),
        "config_hash": np.asarray(str(ckpt.config_hash)),
        "params": np.ascontiguousarray(ckpt.params, dtype=FLOAT),
    }
    if ckpt.previous is not None:
        arrays["previous"] = np.ascontiguousarray(ckpt.previous, dtype=FLOAT)
    for name, value in ckpt.rule_state.items():
        arrays[RULE_STATE_PREFIX + name] = np.ascontiguousarray(value, dtype=FLOAT)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer


def _header_and_tag(payload: bytes | memoryview, key: bytes | None) -> bytes:
    header = HEADER_UNKEYED if key is None else HEADER_KEYED
    return header + _tag(key, header, payload)


def seal(payload: bytes, key: bytes | None) -> bytes:
    """``payload`` behind the header line and its tag under ``key`` (None: unkeyed)."""
    return _header_and_tag(payload, key) + payload


def encode_checkpoint(ckpt: Checkpoint, key: bytes | None) -> bytes:
    """The bytes of the checkpoint file of ``ckpt``: header line, tag, archive."""
    return seal(_archive(ckpt).getvalue(), key)


def save_checkpoint(path: Path, ckpt: Checkpoint, *, key: bytes | None) -> None:
    """Write ``ckpt`` to ``path`` atomically and durably, tagged with ``key`` (None: an
    unkeyed digest); ``OSError`` if it cannot, leaving no temporary file behind."""
    buffer = _archive(ckpt)
    with buffer.getbuffer() as payload:  # the archive is not copied again
        _write_atomically(path, _header_and_tag(payload, key), payload)


def _write_atomically(path: Path, *parts: bytes | memoryview) -> None:
    """``parts`` into ``path``: a private temporary file of this writer's own in the
    same directory (mode 0600), fsynced, renamed over ``path``, the directory fsynced;
    the temporary file removed if anything fails."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            for part in parts:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class CheckpointWriter:
    """Saves checkpoints to ``path`` (tagged with ``key``) in a background thread,
    newest first.

    ``submit`` never blocks and never raises; a failed save is logged, reported to
    ``on_failure`` and retried with the next checkpoint. ``close`` finishes the thread
    and writes the checkpoint it is given, in the caller's thread.
    """

    def __init__(self, path: Path, on_failure: Callable[[], None], *,
                 key: bytes | None) -> None:
        self.path = path
        self.key = key
        self.on_failure = on_failure
        self._pending: Checkpoint | None = None
        self._closed = False
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="checkpoint", daemon=True)
        self._thread.start()

    def submit(self, ckpt: Checkpoint) -> None:
        """Save ``ckpt`` soon (replacing one still waiting); its params must not change."""
        with self._wake:
            self._pending = ckpt
            self._wake.notify()

    def close(self, final: Checkpoint) -> None:
        """Stop the thread, then save ``final`` now."""
        with self._wake:
            self._closed = True
            self._pending = None
            self._wake.notify()
        self._thread.join()
        self._save(final)

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._pending is None and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                ckpt, self._pending = self._pending, None
            self._save(ckpt)

    def _save(self, ckpt: Checkpoint) -> None:
        try:
            save_checkpoint(self.path, ckpt, key=self.key)
        except OSError as exc:
            self.on_failure()
            log.error("checkpoint of round %d to %s failed (%s); retrying at the next one",
                      ckpt.round, self.path, exc)


# -- reading -------------------------------------------------------------------------


def load_checkpoint(path: Path, *, key: bytes | None, expect: Expected) -> Checkpoint:
    """The checkpoint in ``path``, if it was written with ``key`` (None: an unkeyed
    digest, ``--insecure``) and holds what ``expect`` says; otherwise
    :class:`CheckpointError` naming the file and the one reason."""
    data = _read_bounded(path, expect)
    payload = _verified_payload(path, data, key, expect)
    return _decode(path, payload, expect)


def _read_bounded(path: Path, expect: Expected) -> bytes:
    """The file's bytes; refused before reading if it is not a regular file or larger
    than any checkpoint of the shard."""
    limit = expect.max_file_bytes()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise CheckpointError(path, f"cannot open it ({exc.strerror or exc})") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(path, "not a regular file")
        if info.st_size > limit:
            raise CheckpointError(path, f"{info.st_size} bytes, larger than any checkpoint "
                                  f"of shard {expect.shard} (at most {limit} bytes for "
                                  f"{_values_text(expect)})")
        chunks, total = [], 0
        while True:  # a file that grows while read is refused at the limit
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise CheckpointError(path, f"grew past {limit} bytes while read, larger "
                                      f"than any checkpoint of shard {expect.shard}")
    except OSError as exc:
        raise CheckpointError(path, f"cannot read it ({exc.strerror or exc})") from exc
    finally:
        os.close(fd)
    return b"".join(chunks)


def _values_text(expect: Expected) -> str:
    if expect.size is None:
        return f"at most {MAX_SHARD_VALUES} values"
    return f"its {expect.size} values"


def _verified_payload(path: Path, data: bytes, key: bytes | None, expect: Expected) -> bytes:
    """The archive bytes after the header line and tag, once the tag checks out."""
    if not data:
        raise CheckpointError(path, "the file is empty")
    if data.startswith((b"PK\x03\x04", b"PK\x05\x06", b"\x93NUMPY")):
        raise CheckpointError(path, "an old-format checkpoint (a plain .npz with no MAC), "
                              "which this version does not resume: it cannot tell who "
                              "wrote it")
    if not data.startswith(MAGIC):
        raise CheckpointError(path, f"not a checkpoint: it does not start with the "
                              f"{MAGIC.decode()!r} header")
    end = data.find(b"\n", 0, HEADER_MAX)
    if end < 0:
        raise CheckpointError(path, "truncated or malformed header line")
    header = data[:end + 1]
    fields = header[:-1].split(b" ")
    if len(fields) != 3 or fields[0] != MAGIC:
        raise CheckpointError(path, f"malformed header line {_show(header)}")
    if fields[1] != VERSION:
        raise CheckpointError(path, f"format version {_show(fields[1])}; this version "
                              f"reads {VERSION.decode()}")
    if fields[2] not in (KEYED, UNKEYED):
        raise CheckpointError(path, f"unknown integrity check {_show(fields[2])}")
    if key is not None and fields[2] == UNKEYED:
        raise CheckpointError(path, "written without a key (an unkeyed SHA-256 digest, as "
                              "an --insecure server writes), but this run has keys: "
                              "anyone could have written it")
    if key is None and fields[2] == KEYED:
        raise CheckpointError(path, "written with a key (HMAC-SHA256), but this reader has "
                              "none (--insecure) to check it with")
    if len(data) < len(header) + TAG_BYTES:
        raise CheckpointError(path, f"truncated: {len(data)} bytes, shorter than its "
                              f"header and tag")
    tag = data[len(header):len(header) + TAG_BYTES]
    with memoryview(data) as view:
        expected = _tag(key, header, view[len(header) + TAG_BYTES:])
    if not hmac.compare_digest(tag, expected):
        if key is None:
            raise CheckpointError(path, "SHA-256 digest mismatch: the file is torn or "
                                  "corrupted")
        raise CheckpointError(path, f"MAC mismatch: not written with server-"
                              f"{expect.shard}'s key (another server's or another run's "
                              f"file, or altered or truncated since)")
    return data[len(header) + TAG_BYTES:]


def _show(raw: bytes | str, limit: int = 40) -> str:
    """What a file said, quoted, printable and short (never a line break)."""
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _names(names: list[str]) -> str:
    shown = ", ".join(_show(n) for n in names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")


# what a library may raise on a malformed archive or .npy member (never a bug of ours:
# each is turned into a refusal naming the file)
_ARCHIVE_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError,
                   OSError, ValueError, TypeError, KeyError, NotImplementedError,
                   RuntimeError, SyntaxError)


def _decode(path: Path, payload: bytes, expect: Expected) -> Checkpoint:
    try:
        archive = zipfile.ZipFile(io.BytesIO(payload))
    except _ARCHIVE_ERRORS as exc:
        raise CheckpointError(path, f"its archive is unreadable "
                              f"({type(exc).__name__}: {_show(str(exc), 80)})") from exc
    with archive:
        members = _members(path, archive, expect)
        arrays = {name: _read_member(path, archive, info, name, expect)
                  for name, info in members.items()}
    return _checked(path, arrays, expect)


def _members(path: Path, archive: zipfile.ZipFile,
             expect: Expected) -> dict[str, zipfile.ZipInfo]:
    """The archive's members by array name, once their set is exactly a legal one."""
    infos = archive.infolist()
    if len(infos) > len(REQUIRED) + 1 + MAX_RULE_STATES:
        raise CheckpointError(path, f"{len(infos)} members, more than a checkpoint holds")
    members: dict[str, zipfile.ZipInfo] = {}
    unexpected: list[str] = []
    for info in infos:
        name = info.filename[:-4] if info.filename.endswith(".npy") else None
        if name is None or not _legal_member(name, expect):
            unexpected.append(info.filename)
            continue
        if name in members:
            raise CheckpointError(path, f"member {_show(info.filename)} appears twice")
        members[name] = info
    if unexpected:
        raise CheckpointError(path, f"unexpected member(s) {_names(unexpected)}"
                              + _rule_state_text(expect))
    missing = [n + ".npy" for n in REQUIRED if n not in members]
    if missing:
        raise CheckpointError(path, f"missing member(s) {_names(missing)}")
    for name, info in members.items():
        if info.flag_bits & 0x1:
            raise CheckpointError(path, f"member {_show(info.filename)} is encrypted")
        if info.compress_type != zipfile.ZIP_STORED:
            raise CheckpointError(path, f"member {_show(info.filename)} is compressed "
                                  f"(method {info.compress_type}); checkpoints are stored")
        largest = NPY_HEADER_MAX + _largest_data(name, expect)
        if info.file_size > largest:
            raise CheckpointError(path, f"member {_show(info.filename)} declares "
                                  f"{info.file_size} bytes, more than it may hold "
                                  f"({largest} for {_values_text(expect)})")
    return members


def _legal_member(name: str, expect: Expected) -> bool:
    if name in REQUIRED or name == "previous":
        return True
    if not name.startswith(RULE_STATE_PREFIX):
        return False
    state = name[len(RULE_STATE_PREFIX):]
    if expect.rule_state is not None:
        return state in expect.rule_state
    return _RULE_STATE_NAME.fullmatch(state) is not None


def _rule_state_text(expect: Expected) -> str:
    if expect.rule_state is None:
        return ""
    if not expect.rule_state:
        return " (this run's rule keeps no state)"
    return f" (this run's rule keeps {', '.join(sorted(expect.rule_state))})"


def _largest_data(name: str, expect: Expected) -> int:
    if name in ("shard", "round"):
        return INT.itemsize
    if name == "config_hash":
        return 4 * MAX_HASH_CHARS
    return FLOAT.itemsize * expect.max_values()


def _read_member(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str,
                 expect: Expected) -> np.ndarray:
    """One member's array: its .npy header checked (dtype, shape) before its data is
    read; object arrays never loaded."""
    what = f"member {_show(info.filename)}"
    try:
        with archive.open(info) as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(
                    f, max_header_size=NPY_HEADER_MAX)
            elif version == (2, 0):
                shape, _, dtype = np.lib.format.read_array_header_2_0(
                    f, max_header_size=NPY_HEADER_MAX)
            else:
                raise CheckpointError(path, f"{what}: .npy format version {version} "
                                      f"(a checkpoint writes 1.0)")
            _check_header(path, what, name, shape, dtype, expect, info.file_size)
            count = int(np.prod(shape, dtype=np.int64))
            nbytes = count * dtype.itemsize
            data = f.read(nbytes)
            if len(data) != nbytes:
                raise CheckpointError(path, f"{what}: truncated ({len(data)} of its "
                                      f"{nbytes} data bytes)")
            if f.read(1):
                raise CheckpointError(path, f"{what}: bytes after its data")
    except CheckpointError:
        raise
    except _ARCHIVE_ERRORS as exc:
        raise CheckpointError(path, f"{what} is unreadable "
                              f"({type(exc).__name__}: {_show(str(exc), 80)})") from exc
    return np.frombuffer(data, dtype=dtype, count=count).reshape(shape).copy()


def _check_header(path: Path, what: str, name: str, shape: tuple[int, ...],
                  dtype: np.dtype, expect: Expected, file_size: int) -> None:
    """Refuse a member whose declared dtype or shape is not what a checkpoint holds."""
    if dtype.hasobject:
        raise CheckpointError(path, f"{what} holds Python objects (dtype {dtype}); never "
                              f"loaded")
    if name in ("shard", "round"):
        if dtype != INT or shape != ():
            raise CheckpointError(path, f"{what} is {_described(shape, dtype)}, expected "
                                  f"an int64 scalar")
        return
    if name == "config_hash":
        if dtype.kind != "U" or shape != () or dtype.itemsize > 4 * MAX_HASH_CHARS:
            raise CheckpointError(path, f"{what} is {_described(shape, dtype)}, expected "
                                  f"a string of at most {MAX_HASH_CHARS} characters")
        return
    if dtype != FLOAT:
        raise CheckpointError(path, f"{what} has dtype {dtype} ({dtype.str!r}), expected "
                              f"float32 ('<f4')")
    if len(shape) != 1 or shape[0] < 0:
        raise CheckpointError(path, f"{what} has shape {shape}, expected a vector")
    if expect.size is not None and shape != (expect.size,):
        raise CheckpointError(path, f"{what} declares shape {shape}, expected "
                              f"({expect.size},): shard {expect.shard} holds "
                              f"{expect.size} values")
    if shape[0] > expect.max_values() or shape[0] * FLOAT.itemsize > file_size:
        raise CheckpointError(path, f"{what} declares shape {shape}, more values than "
                              f"its {file_size} bytes hold")


def _described(shape: tuple[int, ...], dtype: np.dtype) -> str:
    return f"{dtype} ({dtype.str!r}) of shape {shape}"


def _checked(path: Path, arrays: dict[str, np.ndarray], expect: Expected) -> Checkpoint:
    """The checkpoint the arrays make, once it is this run's and shard's."""
    shard, round_ = int(arrays["shard"]), int(arrays["round"])
    config_hash = str(arrays["config_hash"][()])
    if shard != expect.shard:
        raise CheckpointError(path, f"it holds shard {shard}, not shard {expect.shard}")
    if config_hash != expect.config_hash:
        raise CheckpointError(path, f"configuration hash {_show(config_hash)}, this run's "
                              f"is {expect.config_hash!r} (another run's checkpoint)")
    if not 0 <= round_ <= expect.rounds:
        raise CheckpointError(path, f"round {round_} outside 0..{expect.rounds}")
    if expect.round is not None and round_ != expect.round:
        raise CheckpointError(path, f"round {round_}, not round {expect.round} (the run's "
                              f"last: did it finish?)")
    params = arrays["params"]
    previous = arrays.get("previous")
    if previous is not None and round_ == 0:
        raise CheckpointError(path, "it holds the parameters of a round before round 0")
    rule_state = {k[len(RULE_STATE_PREFIX):]: v for k, v in arrays.items()
                  if k.startswith(RULE_STATE_PREFIX)}
    vectors = {"params": params, "previous": previous,
               **{RULE_STATE_PREFIX + k: v for k, v in rule_state.items()}}
    for name, value in vectors.items():
        if value is None:
            continue
        if value.size != params.size:
            raise CheckpointError(path, f"{name} holds {value.size} values, params "
                                  f"{params.size}")
        if expect.finite:
            bad = value.size - int(np.count_nonzero(np.isfinite(value)))
            if bad:
                raise CheckpointError(path, f"{name} holds {bad} non-finite value(s) "
                                      f"(NaN or inf); a server resumes only finite state")
    return Checkpoint(shard=shard, round=round_, config_hash=config_hash, params=params,
                      previous=previous, rule_state=rule_state)


# -- readers of a run's checkpoints --------------------------------------------------


def read_run_checkpoint(out_dir: Path, cfg: RunConfig, shard: int, keys: KeyRing | None,
                        *, finite: bool, final: bool = False) -> Checkpoint:
    """Shard ``shard``'s checkpoint in ``out_dir`` of the run ``cfg``, checked with the
    run's keys (None: ``--insecure``, unkeyed digests); ``final``: at the last round."""
    expect = Expected.of(cfg, shard, finite=finite, round=cfg.rounds if final else None)
    return load_checkpoint(checkpoint_path(out_dir, shard), key=server_mac_key(keys, shard),
                           expect=expect)


def params_digest(params: np.ndarray) -> str:
    """SHA-256 of the float32 little-endian bytes of a parameter vector."""
    return hashlib.sha256(np.ascontiguousarray(params, dtype="<f4").tobytes()).hexdigest()


def final_parameters(out_dir: Path, cfg: RunConfig, keys: KeyRing | None) -> np.ndarray:
    """The whole model vector of the finished run ``cfg`` in ``out_dir``: its shards'
    checkpoints at the last round, each checked with its server's key (None:
    ``--insecure``), in order; ``CheckpointError`` if one is refused or their sizes are
    not a split of one model. Non-finite values are what the run produced, and kept."""
    shards = [read_run_checkpoint(out_dir, cfg, s, keys, finite=False, final=True).params
              for s in range(cfg.num_shards)]
    sizes = [p.size for p in shards]
    d = sum(sizes)
    if d < cfg.num_shards or sizes != [b - a for a, b in shard_ranges(d, cfg.num_shards)]:
        raise CheckpointError(out_dir / "shard-*.npz", f"the shards hold {sizes} values, "
                              f"not a split of one model of {d} values into "
                              f"{cfg.num_shards}")
    return np.concatenate(shards)
