"""The checkpoint file's layout, what a checkpoint holds and what a reader expects.

Layout (all integers little-endian)::

    line    b"byzps-checkpoint 2 hmac-sha256\\n"  (b"... 2 sha256\\n": --insecure)
    table   shard u32, round i64, config hash 64 bytes ASCII NUL-padded, arrays u32;
            per array: its name, 32 bytes ASCII NUL-padded, and its values, u64
    tag     32 bytes over line, table and arrays (``seal.py``)
    arrays  the values, float32 little-endian, in the table's order

The arrays are ``params``, ``previous`` (the round before; absent at round 0) and a
stateful rule's state, ``rule_<name>``. The table is fixed-size apart from its count of
arrays, so a reader checks every count and name against an :class:`Expected` before any
array is read or allocated, and the file's size against what the table declares.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from common.errors import ConfigError

if TYPE_CHECKING:
    from common.run.config import RunConfig

MAGIC = b"byzps-checkpoint"
VERSION = b"2"
KEYED = b"hmac-sha256"
UNKEYED = b"sha256"
LINE_KEYED = MAGIC + b" " + VERSION + b" " + KEYED + b"\n"
LINE_UNKEYED = MAGIC + b" " + VERSION + b" " + UNKEYED + b"\n"
LINE_MAX = 64  # a longer first line is not one of ours
TAG_BYTES = 32
HASH_BYTES, NAME_BYTES = 64, 32
FIXED = struct.Struct(f"<Iq{HASH_BYTES}sI")  # shard, round, config hash, number of arrays
ENTRY = struct.Struct(f"<{NAME_BYTES}sQ")  # an array's name and number of values
FLOAT = np.dtype("<f4")

PARAMS, PREVIOUS, RULE_STATE_PREFIX = "params", "previous", "rule_"
MAX_RULE_STATES = 4  # rule_<name> arrays a checkpoint may hold
_RULE_STATE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,26}", re.ASCII)  # fits NAME_BYTES
# what a plain .npz (the format before version 1) or a bare .npy starts with
OLD_FORMAT = (b"PK\x03\x04", b"PK\x05\x06", b"\x93NUMPY")


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

    ``size``: the shard's number of values (every array holds exactly that many).
    ``rule_state``: the names of the rule's state arrays (None: any, up to
    ``MAX_RULE_STATES``; empty: a rule that keeps none). ``finite``: refuse NaN and inf
    (a server resumes only finite state; readers of a finished run's result accept what
    the run produced). ``round``: the exact round required (None: any in 0..rounds).
    """

    shard: int
    rounds: int
    config_hash: str
    size: int
    rule_state: frozenset[str] | None = None
    finite: bool = True
    round: int | None = None

    @classmethod
    def of(cls, cfg: RunConfig, shard: int, size: int,
           rule_state: frozenset[str] | None = None, finite: bool = True,
           round: int | None = None) -> Expected:
        """The expectation of shard ``shard`` (``size`` values) of the run ``cfg``."""
        return cls(shard=shard, rounds=cfg.rounds, config_hash=cfg.config_hash, size=size,
                   rule_state=rule_state, finite=finite, round=round)

    def max_arrays(self) -> int:
        return 2 + (MAX_RULE_STATES if self.rule_state is None else len(self.rule_state))

    def max_file_bytes(self) -> int:
        """The largest legal checkpoint file of this shard: nothing larger is read."""
        return (LINE_MAX + FIXED.size + self.max_arrays() * ENTRY.size + TAG_BYTES
                + self.max_arrays() * FLOAT.itemsize * self.size)


@dataclass(frozen=True)
class Table:
    """What a file's table declares: checked before any array is read."""

    shard: int
    round: int
    config_hash: str
    arrays: tuple[tuple[str, int], ...]  # (name, number of values), in the file's order

    def file_bytes(self, line: bytes) -> int:
        """The exact size of the file this table describes (its first line ``line``)."""
        return (len(line) + FIXED.size + len(self.arrays) * ENTRY.size + TAG_BYTES
                + FLOAT.itemsize * sum(n for _, n in self.arrays))


def line_of(keyed: bool) -> bytes:
    return LINE_KEYED if keyed else LINE_UNKEYED


def encode(ckpt: Checkpoint, keyed: bool) -> tuple[bytes, list[np.ndarray]]:
    """The line and table of ``ckpt``'s file, and its arrays as float32 little-endian
    (copied only if they are not already)."""
    arrays = {PARAMS: ckpt.params}
    if ckpt.previous is not None:
        arrays[PREVIOUS] = ckpt.previous
    arrays.update({RULE_STATE_PREFIX + k: v for k, v in ckpt.rule_state.items()})
    values = [np.ascontiguousarray(v, dtype=FLOAT).reshape(-1) for v in arrays.values()]
    table = FIXED.pack(ckpt.shard, ckpt.round, _field(ckpt.config_hash, HASH_BYTES), len(values))
    for name, value in zip(arrays, values, strict=True):
        table += ENTRY.pack(_field(name, NAME_BYTES), value.size)
    return line_of(keyed) + table, values


def _field(text: str, size: int) -> bytes:
    """``text`` for a fixed field of ``size`` bytes (struct would cut it silently)."""
    raw = text.encode("ascii")
    if len(raw) > size:
        raise ValueError(f"{text[:40]!r}... does not fit a checkpoint field of {size} bytes")
    return raw


def check_line(path: Path, line: bytes, keyed: bool) -> None:
    """Refuse a first line that is not this version's, or whose tag kind is not the
    reader's: a keyed reader never accepts an unkeyed digest (anyone can compute one)."""
    if line.startswith(OLD_FORMAT):
        raise CheckpointError(path, "an old-format checkpoint (a plain .npz with no MAC), "
                              "which this version does not resume: it cannot tell who "
                              "wrote it")
    if not line.startswith(MAGIC):
        raise CheckpointError(path, f"not a checkpoint: it does not start with the "
                              f"{MAGIC.decode()!r} header")
    if not line.endswith(b"\n"):
        raise CheckpointError(path, "truncated or malformed header line")
    fields = line[:-1].split(b" ")
    if len(fields) != 3 or fields[0] != MAGIC:
        raise CheckpointError(path, f"malformed header line {show(line)}")
    if fields[1] == b"1":
        raise CheckpointError(path, "format version '1' (an .npz archive behind a MAC), "
                              "which this version does not resume; it reads version 2")
    if fields[1] != VERSION:
        raise CheckpointError(path, f"format version {show(fields[1])}; this version "
                              f"reads {VERSION.decode()}")
    if fields[2] not in (KEYED, UNKEYED):
        raise CheckpointError(path, f"unknown integrity check {show(fields[2])}")
    if keyed and fields[2] == UNKEYED:
        raise CheckpointError(path, "written without a key (an unkeyed SHA-256 digest, as "
                              "an --insecure server writes), but this run has keys: "
                              "anyone could have written it")
    if not keyed and fields[2] == KEYED:
        raise CheckpointError(path, "written with a key (HMAC-SHA256), but this reader has "
                              "none (--insecure) to check it with")


def decode_fixed(path: Path, raw: bytes, expect: Expected) -> tuple[int, int, str, int]:
    """(shard, round, config hash, number of arrays), each checked against ``expect``:
    another shard's or run's file, or a table too long to be ours, is refused here."""
    shard, round_, raw_hash, count = FIXED.unpack(raw)
    if shard != expect.shard:
        raise CheckpointError(path, f"it holds shard {shard}, not shard {expect.shard}")
    config_hash = _ascii(path, raw_hash, "configuration hash")
    if config_hash != expect.config_hash:
        raise CheckpointError(path, f"configuration hash {show(config_hash)}, this run's "
                              f"is {expect.config_hash!r} (another run's checkpoint)")
    if not 0 <= round_ <= expect.rounds:
        raise CheckpointError(path, f"round {round_} outside 0..{expect.rounds}")
    if expect.round is not None and round_ != expect.round:
        raise CheckpointError(path, f"round {round_}, not round {expect.round} (the run's "
                              f"last: did it finish?)")
    if not 1 <= count <= expect.max_arrays():
        raise CheckpointError(path, f"it declares {count} arrays; a checkpoint of this run "
                              f"holds 1 to {expect.max_arrays()}")
    return shard, round_, config_hash, count


def decode_entries(path: Path, raw: bytes, fixed: tuple[int, int, str, int],
                   expect: Expected) -> Table:
    """The table, once every array's name is legal and once only, and every count is
    the shard's size: a declared size never allocates anything."""
    shard, round_, config_hash, _ = fixed
    arrays: list[tuple[str, int]] = []
    for raw_name, values in ENTRY.iter_unpack(raw):
        name = _ascii(path, raw_name, "an array name")
        if not _legal(name, expect):
            raise CheckpointError(path, f"unexpected array {show(name)}"
                                  + _rule_state_text(expect))
        if any(name == seen for seen, _ in arrays):
            raise CheckpointError(path, f"array {show(name)} appears twice")
        if values != expect.size:
            raise CheckpointError(path, f"array {show(name)} declares {values} values, "
                                  f"expected {expect.size}: shard {expect.shard} holds "
                                  f"{expect.size} values")
        arrays.append((name, values))
    names = [name for name, _ in arrays]
    if PARAMS not in names:
        raise CheckpointError(path, f"missing array {PARAMS!r}")
    if PREVIOUS in names and round_ == 0:
        raise CheckpointError(path, "it holds the parameters of a round before round 0")
    return Table(shard, round_, config_hash, tuple(arrays))


def _ascii(path: Path, raw: bytes, what: str) -> str:
    """A NUL-padded ASCII field; anything else (a stray byte, a NUL inside) refused."""
    text = raw.rstrip(b"\0")
    if b"\0" in text or not all(0x20 < b < 0x7F for b in text):
        raise CheckpointError(path, f"{what} {show(text)} is not printable ASCII")
    return text.decode("ascii")


def _legal(name: str, expect: Expected) -> bool:
    if name in (PARAMS, PREVIOUS):
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


def show(raw: bytes | str, limit: int = 40) -> str:
    """What a file said, quoted, ASCII and short (never a line break)."""
    text = raw.decode("latin-1") if isinstance(raw, bytes) else raw
    return ascii(text if len(text) <= limit else text[:limit] + "...")
