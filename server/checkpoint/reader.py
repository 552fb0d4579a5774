"""Reading a checkpoint: bounded, streamed, and nothing used before its tag checks out.

In order: the file must be a regular file; its first line (at most 64 bytes) this
version's, with the reader's kind of tag; its size no larger than the largest legal
checkpoint of the shard (a 64 GiB file is refused unread); its table must name this
run's shard and configuration, a round of the run, legal arrays, each of the shard's
size (``format.py``); and its size must be exactly what the table declares (a truncated
file, or one with bytes added, is refused before any array is read). Only then are the
arrays read, block by block, straight into float32 arrays of the declared size while
the tag is computed over them: about one copy of the state in memory, never a
4e12-value allocation. Then the tag is compared (constant time), then the values'
finiteness (``Expected.finite``).
"""

from __future__ import annotations

import hmac
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from io import BufferedReader
from pathlib import Path
from typing import Any, cast

import numpy as np

from server.checkpoint import seal
from server.checkpoint.format import (
    ENTRY,
    FIXED,
    FLOAT,
    LINE_MAX,
    PARAMS,
    PREVIOUS,
    RULE_STATE_PREFIX,
    TAG_BYTES,
    Checkpoint,
    CheckpointError,
    Expected,
    check_line,
    decode_entries,
    decode_fixed,
)

BLOCK = 1 << 20  # bytes read and hashed at a time, straight into the array
BUFFER = 1 << 16  # the reader's own buffer: for the line and table only


def load_checkpoint(path: Path, *, key: bytes | None, expect: Expected) -> Checkpoint:
    """The checkpoint in ``path``, if it was written with ``key`` (None: an unkeyed
    digest, ``--insecure``) and holds what ``expect`` says; otherwise
    :class:`CheckpointError` naming the file and the one reason."""
    with _opened(path, expect, keyed=key is not None) as (f, line, size):
        fixed_raw = _exact(path, f, FIXED.size, size)
        fixed = decode_fixed(path, fixed_raw, expect)
        entries_raw = _exact(path, f, fixed[3] * ENTRY.size, size)
        table = decode_entries(path, entries_raw, fixed, expect)
        declared = table.file_bytes(line)
        if size < declared:
            raise CheckpointError(path, f"truncated: {size} bytes, its header declares "
                                  f"{declared}")
        if size > declared:
            raise CheckpointError(path, f"{size} bytes, more than the {declared} its header "
                                  f"declares (bytes added after its arrays)")
        stored = _exact(path, f, TAG_BYTES, size)
        running = seal.digest(key, line + fixed_raw + entries_raw)
        arrays = {name: _read_array(path, f, values, running) for name, values in table.arrays}
        if f.read(1):
            raise CheckpointError(path, f"grew past its {declared} bytes while read")
    if not hmac.compare_digest(stored, running.digest()):
        if key is None:
            raise CheckpointError(path, "SHA-256 digest mismatch: the file is torn or "
                                  "corrupted")
        raise CheckpointError(path, f"MAC mismatch: not written with server-"
                              f"{expect.shard}'s key (another server's or another run's "
                              f"file, or altered since)")
    if expect.finite:
        for name, values in arrays.items():
            bad = _nonfinite(values)
            if bad:
                raise CheckpointError(path, f"{name} holds {bad} non-finite value(s) (NaN "
                                      f"or inf); a server resumes only finite state")
    return Checkpoint(shard=table.shard, round=table.round, config_hash=table.config_hash,
                      params=arrays[PARAMS], previous=arrays.get(PREVIOUS),
                      rule_state={name[len(RULE_STATE_PREFIX):]: values
                                  for name, values in arrays.items()
                                  if name.startswith(RULE_STATE_PREFIX)})


@contextmanager
def _opened(path: Path, expect: Expected,
            keyed: bool) -> Iterator[tuple[BufferedReader, bytes, int]]:
    """The open file positioned after its first line, the line and the file's size.
    Refused having read at most that line (``LINE_MAX`` bytes) if it is not a regular
    file (a FIFO would block: opened non-blocking), is empty, is not this version's
    checkpoint or not of the reader's tag kind, or is larger than any checkpoint of the
    shard. A failing read is a refusal too."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise CheckpointError(path, f"cannot open it ({exc.strerror or exc})") from exc
    try:
        info = os.fstat(fd)
        size = info.st_size
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(path, "not a regular file")
        if size == 0:
            raise CheckpointError(path, "the file is empty")
        first = os.pread(fd, LINE_MAX, 0)
        line = first[:first.find(b"\n") + 1] or first
        check_line(path, line, keyed)
        limit = expect.max_file_bytes()
        if size > limit:
            raise CheckpointError(path, f"{size} bytes, larger than any checkpoint of shard "
                                  f"{expect.shard} (at most {limit} bytes for its "
                                  f"{expect.size} values)")
        os.lseek(fd, len(line), os.SEEK_SET)
        # (binary and buffered: a BufferedReader, which typeshed leaves a BinaryIO)
        f = cast(BufferedReader, os.fdopen(fd, "rb", buffering=BUFFER))
    except OSError as exc:
        os.close(fd)
        raise CheckpointError(path, f"cannot read it ({exc.strerror or exc})") from exc
    except BaseException:
        os.close(fd)
        raise
    with f:
        try:
            yield f, line, size
        except OSError as exc:
            raise CheckpointError(path, f"cannot read it ({exc.strerror or exc})") from exc


def _exact(path: Path, f: BufferedReader, count: int, size: int) -> bytes:
    data = f.read(count)
    if len(data) != count:
        raise CheckpointError(path, f"truncated: {size} bytes, shorter than its header")
    return data


def _read_array(path: Path, f: BufferedReader, values: int, running: Any) -> np.ndarray:
    """``values`` float32 read into one array of that size, hashed block by block."""
    array = np.empty(values, dtype=FLOAT)
    view = array.data.cast("B")  # memoryview(array): numpy types its buffer from 3.12
    for start in range(0, len(view), BLOCK):
        block = view[start:start + BLOCK]
        if f.readinto(block) != len(block):
            raise CheckpointError(path, "truncated while read (it shrank)")
        running.update(block)
    return array


def _nonfinite(values: np.ndarray) -> int:
    """NaN and inf in ``values``, counted a block at a time (no array-sized mask)."""
    step = BLOCK // FLOAT.itemsize
    return sum(int(np.count_nonzero(~np.isfinite(values[i:i + step])))
               for i in range(0, values.size, step))
