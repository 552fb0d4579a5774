"""The checkpoints of a server process hosting several shards: one file per shard, and a
round they all share to resume from.

A process writes and syncs its shards' new files first, then renames them over the
old ones one after the other, so one killed in between leaves some shards at the new
round and the others at an older one (a full disk fails before any rename: every
shard stays at its round). With more than one shard, each file's previous generation
is kept (``shard-<s>.prev.npz``, a hard link made before the new file replaces it), and only
the file of the last round *every* shard was saved at (``complete``) ever becomes a
previous generation: a file of a save that did not complete, or one left from before
a resume, is replaced, never kept. So at any moment every shard has a file of the last
complete round, current or previous, and a process resumes at the newest round all
its shards have (round 0, the initial parameters, if some shard has no file at all:
its first save was cut short); the workers replay what came after it. A process
hosting one shard writes and reads its one file, as before.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from server.checkpoint.format import Checkpoint, CheckpointError, Expected
from server.checkpoint.reader import load_checkpoint
from server.checkpoint.run import checkpoint_path
from server.checkpoint.writer import checkpoint_parts, write_all_atomically


def previous_path(out_dir: Path, shard: int) -> Path:
    """The generation before ``shard``'s current checkpoint (processes of several shards)."""
    return out_dir / f"shard-{shard}.prev.npz"


class GroupFiles:
    """Where a server process saves its ``shards`` in ``out_dir``, each file tagged with
    its shard's MAC key (``keys[shard]``; None: unkeyed)."""

    def __init__(self, out_dir: Path, shards: Sequence[int],
                 keys: Mapping[int, bytes | None]) -> None:
        self.out_dir = out_dir
        self.shards = tuple(shards)
        self.keys = dict(keys)
        self.keep_previous = len(self.shards) > 1
        self.complete: int | None = None  # the last round every shard was saved at
        self.current: dict[int, int] = {}  # the round of each shard's current file

    def discard_previous(self) -> None:
        """Forget the previous generations in ``out_dir`` (a fresh start: they belong to
        another run, and must never be resumed)."""
        for shard in self.shards:
            with contextlib.suppress(FileNotFoundError):
                previous_path(self.out_dir, shard).unlink()

    def save(self, ckpts: Sequence[Checkpoint]) -> None:
        """Write every shard's checkpoint, atomically and durably, all together
        (``write_all_atomically``: one sync of the directory for all), keeping as the previous
        generation only a file of the last complete round (linked before any file is
        replaced); ``OSError`` if one fails (the round is then not complete)."""
        paths = [checkpoint_path(self.out_dir, ckpt.shard) for ckpt in ckpts]

        def keep_previous() -> None:
            for ckpt, path in zip(ckpts, paths, strict=True):
                at = self.current.get(ckpt.shard)
                if self.keep_previous and at is not None and at == self.complete:
                    _link_over(path, previous_path(self.out_dir, ckpt.shard))
            for ckpt in ckpts:  # (a link that failed left them known: nothing replaced)
                self.current.pop(ckpt.shard, None)  # unknown until the new file is in

        write_all_atomically([(path, checkpoint_parts(ckpt, self.keys[ckpt.shard]))
                              for ckpt, path in zip(ckpts, paths, strict=True)],
                             keep_previous)
        self.current.update((ckpt.shard, ckpt.round) for ckpt in ckpts)
        rounds = {ckpt.round for ckpt in ckpts}
        if len(rounds) == 1 and {c.shard for c in ckpts} == set(self.shards):
            self.complete = rounds.pop()

    def load(self, expect: Mapping[int, Expected]) -> list[Checkpoint] | None:
        """The hosted shards' checkpoints of the newest round they all have (each
        checked as ``load_checkpoint`` checks it: ``CheckpointError`` naming a refused
        file); None for round 0 (no file, or a shard without one). The previous
        generations are read only when the current files disagree."""
        current = {s: self._read(checkpoint_path(self.out_dir, s), s, expect)
                   for s in self.shards}
        self.current = {s: c.round for s, c in current.items() if c is not None}
        rounds = {c.round for c in current.values() if c is not None}
        if len(self.current) == len(self.shards) and len(rounds) == 1:
            self.complete = rounds.pop()
            return [c for s in self.shards if (c := current[s]) is not None]  # (all are)
        found = {s: {} if c is None else {c.round: c} for s, c in current.items()}
        if self.keep_previous:
            for s in self.shards:
                before = self._read(previous_path(self.out_dir, s), s, expect)
                if before is not None:
                    found[s].setdefault(before.round, before)
        if not all(found.values()):
            return None  # a shard never saved: its first save was cut short
        shared = set.intersection(*(set(rounds) for rounds in found.values()))
        if not shared:
            raise CheckpointError(checkpoint_path(self.out_dir, self.shards[0]), (
                f"the checkpoints of shards {list(self.shards)} share no round "
                f"({ {s: sorted(r) for s, r in found.items()} }): they are not one "
                f"server process's"))
        self.complete = max(shared)
        return [found[s][self.complete] for s in self.shards]

    def _read(self, path: Path, shard: int,
              expect: Mapping[int, Expected]) -> Checkpoint | None:
        if not os.path.lexists(path):
            return None
        return load_checkpoint(path, key=self.keys[shard], expect=expect[shard])


def _link_over(path: Path, target: Path) -> None:
    """``target`` becomes another name of ``path``'s file (replacing what it was)."""
    tmp = target.with_name(target.name + ".link.tmp")
    try:
        os.link(path, tmp)
    except FileExistsError:  # left by a process killed here
        tmp.unlink()
        os.link(path, tmp)
    os.replace(tmp, target)
