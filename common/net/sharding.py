"""The one place that knows how the model vector is split into shards, and how the
shards are spread over server processes.

Shards are the unit of aggregation and of corruption (the paper's servers); a server
*process* hosts a set of them (``ps-server --shard 0-4``), the way a ps-lite server
node holds many key ranges, and a worker sends one PUSH per process carrying the
slices of every shard it hosts, in shard order. A process is named by its first
(lowest) shard: its key is ``server-<first>``, its proxy's ``proxy-<first>``, so with
one shard per process every name is the shard's own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from common.errors import ConfigError

ShardSet = tuple[int, ...]

MAX_SHARDS = 1 << 16  # a shard set named without S is checked against this
_PART = re.compile(r"(0|[1-9][0-9]{0,8})(?:-(0|[1-9][0-9]{0,8}))?", re.ASCII)


def shard_ranges(d: int, num_shards: int) -> list[tuple[int, int]]:
    """Split ``[0, d)`` into ``num_shards`` contiguous, near-equal ``(start, stop)`` ranges.

    The first ``d % num_shards`` shards get one extra coordinate, so sizes differ by at
    most one and the ranges cover ``[0, d)`` exactly, in order.
    """
    if d < 1:
        raise ValueError(f"the model must have at least one parameter, got d={d}")
    if num_shards < 1:
        raise ValueError(f"need at least one shard, got S={num_shards}")
    if num_shards > d:
        raise ValueError(f"cannot split d={d} parameters into S={num_shards} non-empty shards")
    base, extra = divmod(d, num_shards)
    ranges = []
    start = 0
    for s in range(num_shards):
        stop = start + base + (1 if s < extra else 0)
        ranges.append((start, stop))
        start = stop
    return ranges


def parse_shard_set(spec: str | int, num_shards: int | None = None) -> ShardSet:
    """The shards ``spec`` names: an index (``3``), a range (``0-4``, both ends in) or a
    comma list of these (``1,3``, ``0-2,5``); sorted. ``ConfigError`` for anything
    else, an empty or repeated shard, or (given S) a shard outside 0..S-1."""
    return parse_index_set(spec, num_shards, "shard", "S")


def parse_index_set(spec: str | int, bound: int | None, what: str,
                    count: str) -> tuple[int, ...]:
    """The indices ``spec`` names, as :func:`parse_shard_set` reads them, of ``what``
    (shard, worker) of which the run has ``count`` (S, n) = ``bound``."""
    text = str(spec).strip()
    indices: list[int] = []
    for part in text.split(","):
        match = _PART.fullmatch(part.strip())
        if match is None:
            raise ConfigError(f"{what}s {text!r}: {part.strip()!r} is not an index or a "
                              f"range a-b (e.g. 3, 0-4 or 1,3)")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise ConfigError(f"{what}s {text!r}: the range {part.strip()} is empty")
        limit = MAX_SHARDS if bound is None else bound
        if last >= limit:  # before the range is spelt out: 0-999999999 costs nothing
            raise ConfigError(f"{what}s {text!r}: the run has {count}={limit} {what}s "
                              f"(0..{limit - 1})" if bound is not None else
                              f"{what}s {text!r}: at most {MAX_SHARDS} {what}s")
        indices.extend(range(first, last + 1))
    if len(set(indices)) != len(indices):
        raise ConfigError(f"{what}s {text!r} names a {what} twice")
    return tuple(sorted(indices))


def format_shard_set(shards: Iterable[int]) -> str:
    """The canonical spelling of a shard set: ``0-4``, ``1,3``, ``0-2,5``."""
    ordered = sorted(shards)
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def server_blocks(num_shards: int, processes: int) -> list[ShardSet]:
    """``processes`` contiguous, near-equal blocks of the shards 0..S-1, in order (the
    default spread of ``ps-cluster --server-processes``: the first blocks one larger)."""
    if not 1 <= processes <= num_shards:
        raise ConfigError(f"--server-processes {processes} must be in 1..S={num_shards}")
    return [tuple(range(a, b)) for a, b in shard_ranges(num_shards, processes)]


@dataclass(frozen=True)
class ServerSlices:
    """Where a server process's shards lie in the model vector: each shard's range, in
    shard order, and the same merged into contiguous spans (what a PUSH to it carries,
    concatenated: ``length`` values)."""

    shards: ShardSet
    ranges: tuple[tuple[int, int], ...]
    spans: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, d: int, num_shards: int, shards: Sequence[int]) -> ServerSlices:
        all_ranges = shard_ranges(d, num_shards)
        ranges = tuple(all_ranges[s] for s in shards)
        spans: list[tuple[int, int]] = []
        for start, stop in ranges:
            if spans and spans[-1][1] == start:
                spans[-1] = (spans[-1][0], stop)
            else:
                spans.append((start, stop))
        return cls(tuple(shards), ranges, tuple(spans))

    @property
    def length(self) -> int:
        return sum(b - a for a, b in self.ranges)

    @property
    def offsets(self) -> tuple[int, ...]:
        """Where each shard's values begin in a message's payload."""
        out, at = [], 0
        for a, b in self.ranges:
            out.append(at)
            at += b - a
        return tuple(out)


_SHARDS_AT = re.compile(r"\s*[0-9][0-9,\s-]*@", re.ASCII)


def parse_servers(spec: str, num_shards: int) -> list[tuple[ShardSet, str]]:
    """The server processes a comma-separated ``--servers`` list names, as (shards,
    endpoint): plain endpoints are the contiguous blocks of :func:`server_blocks` in
    order (one per shard when there are S of them); ``SHARDS@ENDPOINT`` entries name
    each process's shards (``0-4@tcp://10.0.0.1:5550;5-9@tcp://...``: entries with
    shards are separated by ``;``, since a shard list holds commas; a plain list whose
    endpoints hold ``@``, such as an ``ipc://`` path, is read as endpoints when no entry
    starts with a shard set). Every shard must be hosted exactly once; ``ConfigError``
    otherwise."""
    text = spec.strip()
    if "@" in text and _SHARDS_AT.match(text):
        entries = [e.strip() for e in text.split(";") if e.strip()]
        out = []
        for entry in entries:
            shards, at, endpoint = entry.partition("@")
            if not at or not endpoint.strip():
                raise ConfigError(f"--servers entry {entry!r}: write SHARDS@ENDPOINT for every "
                                  f"server when one names its shards")
            if "@" in endpoint:
                raise ConfigError(f"--servers entry {entry!r}: separate SHARDS@ENDPOINT "
                                  f"entries with ';'")
            out.append((parse_shard_set(shards, num_shards), endpoint.strip()))
    else:
        endpoints = [e.strip() for e in text.split(",") if e.strip()]
        if not 1 <= len(endpoints) <= num_shards:
            raise ConfigError(f"{len(endpoints)} server endpoints given for S={num_shards} "
                              f"shards (one per server process, 1..S)")
        out = list(zip(server_blocks(num_shards, len(endpoints)), endpoints, strict=True))
    hosted = sorted(s for shards, _ in out for s in shards)
    if hosted != list(range(num_shards)):
        raise ConfigError(f"--servers hosts shards {format_shard_set(hosted) or 'none'} "
                          f"{'(some twice) ' if len(set(hosted)) != len(hosted) else ''}"
                          f"but the run has shards 0-{num_shards - 1}, each hosted once")
    return sorted(out)
