"""Writing checkpoints: atomically, durably, privately, off the server's critical path.

A file is written to a temporary file unique to the writer (``tempfile.mkstemp`` in the
same directory, mode 0600: no other writer's file is clobbered, no other user reads
it), fsynced, renamed over the old one, and the directory fsynced: a process or machine
that dies at any moment leaves the previous or the new checkpoint, never a torn one. A
failed write (a full disk, no file descriptor left) removes its temporary file. A
process of several shards writes and syncs all its files before it renames any, and
syncs the directory once (:func:`write_all_atomically`).

Syncing costs milliseconds (under the quick-start load: median 4-5 ms, p90 10 ms, about
a tenth of a round), so a server hands its checkpoints to a :class:`CheckpointWriter`
thread: it saves the newest one handed to it (skipping any it had no time for), and at
exit the last one is written before the process ends. A resumed server may therefore
be a round or two behind its workers, which replay what it lacks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from server.checkpoint import seal
from server.checkpoint.format import Checkpoint, encode

if TYPE_CHECKING:
    from server.checkpoint.group import GroupFiles

log = logging.getLogger("ps.checkpoint")


def encode_checkpoint(ckpt: Checkpoint, key: bytes | None) -> bytes:
    """The bytes of ``ckpt``'s file (tagged with ``key``; None: unkeyed), in memory."""
    head, arrays = encode(ckpt, keyed=key is not None)
    return b"".join([head, seal.tag(key, head, arrays), *(a.tobytes() for a in arrays)])


def checkpoint_parts(ckpt: Checkpoint, key: bytes | None) -> list[Any]:
    """The buffers of ``ckpt``'s file, tagged with ``key`` (None: an unkeyed digest): its
    arrays are hashed and written where they are, never copied."""
    head, arrays = encode(ckpt, keyed=key is not None)
    views = [a.data.cast("B") for a in arrays]  # memoryview(a): numpy types it from 3.12
    return [head, seal.tag(key, head, views), *views]


def save_checkpoint(path: Path, ckpt: Checkpoint, *, key: bytes | None) -> None:
    """Write ``ckpt`` to ``path`` atomically and durably, tagged with ``key`` (None: an
    unkeyed digest); ``OSError`` if it cannot, leaving no temporary file behind."""
    write_atomically(path, *checkpoint_parts(ckpt, key))


def write_atomically(path: Path, *parts: Any) -> None:
    """``parts`` (buffers) into ``path``: a private temporary file of this writer's own
    in the same directory, fsynced, renamed over ``path``, the directory fsynced; the
    temporary file removed if anything fails."""
    write_all_atomically([(path, parts)])


def write_all_atomically(files: Sequence[tuple[Path, Sequence[Any]]],
                         before_renames: Callable[[], None] = lambda: None) -> None:
    """Each (path, parts) of ``files`` as :func:`write_atomically` writes one, together:
    every temporary file written and fsynced (a full disk fails here, before any file
    is replaced), ``before_renames()`` called, each renamed over its path in order, and
    each directory fsynced once, not once per file. ``OSError`` if anything fails, every
    temporary file not renamed then removed."""
    temps: list[Path] = []
    renamed = 0
    try:
        for path, parts in files:
            fd, name = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".",
                                        suffix=".tmp")
            temps.append(Path(name))
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), 0o600)
                for part in parts:
                    f.write(part)
                f.flush()
                os.fsync(f.fileno())
        before_renames()
        for (path, _), tmp in zip(files, temps, strict=True):
            os.replace(tmp, path)
            renamed += 1
    except BaseException:
        for tmp in temps[renamed:]:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise
    for directory in dict.fromkeys(path.parent for path, _ in files):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class CheckpointWriter:
    """Saves a server process's checkpoints (a list, one per hosted shard) to its
    ``GroupFiles`` in a background thread, newest first.

    ``submit`` never blocks and never raises; a failed save is logged, reported to
    ``on_failure`` and retried with the next checkpoint. ``close`` finishes the thread
    and writes the checkpoints it is given, in the caller's thread.
    """

    def __init__(self, target: GroupFiles, on_failure: Callable[[], None]) -> None:
        self.target = target
        self.on_failure = on_failure
        self._pending: list[Checkpoint] | None = None
        self._closed = False
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="checkpoint", daemon=True)
        self._thread.start()

    def submit(self, ckpts: list[Checkpoint]) -> None:
        """Save ``ckpts`` soon (replacing any still waiting); their arrays must not
        change."""
        with self._wake:
            self._pending = ckpts
            self._wake.notify()

    def close(self, final: list[Checkpoint]) -> None:
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
                ckpts, self._pending = self._pending, None
            if ckpts is None:  # (the wait above ends with one, or closed)
                raise RuntimeError("the checkpoint writer woke with nothing to write")
            self._save(ckpts)

    def _save(self, ckpts: list[Checkpoint]) -> None:
        try:
            self.target.save(ckpts)
        except OSError as exc:
            self.on_failure()
            log.error("checkpoint of round %d to %s failed (%s); retrying at the next one",
                      ckpts[0].round, self.target.out_dir, exc)
