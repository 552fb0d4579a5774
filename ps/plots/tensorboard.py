"""TensorBoard event files of a run, from its metrics files, when the optional extra
``byzps[tensorboard]`` is installed (without it nothing is written and nothing said).

A :class:`RunEvents` tails the JSON lines a run writes in its directory and turns each
new line into scalars, step = the round, in ``<run>/tensorboard/`` (one run per
directory, so ``tensorboard --logdir runs/`` shows every run side by side):

* ``test/top1``, ``test/top3``, ``test/loss`` (``evaluator.jsonl``);
* ``train/loss`` per worker, and ``time/compute_ms``, ``time/exchange_ms`` per worker
  (``worker-<i>.jsonl``: the round split into computing and exchanging);
* ``server/aggregation_ms``, ``server/lr`` (the rate the round applied),
  ``server/missing_workers`` and ``server/nonfinite_values`` per shard
  (``server-<s>.jsonl``; the reference engine's ``engine.jsonl``: its aggregation time
  and rate per shard and the values corrupted, ``proxy/corrupted_values``);
* ``proxy/corrupted_values`` per proxy (``proxy-<s>.jsonl``);
* ``cluster/restarts``: processes restarted so far, at the round they happened.

The per-round series (workers, shards, proxies, the engine) are written every
``every`` rounds (``--tensorboard-every``, 10 by default): one scalar per worker and
round is thousands of events a second at 20 workers and 20 rounds/s, CPU taken from
the run; evaluations and restarts are always written, and so is every shard's round
that closed without some workers or held non-finite values.

``ps-cluster`` calls :meth:`RunEvents.update` at each progress tick, so the events
follow the run as it goes; ``ps-simulate`` once at the end. The experiment runner
writes each cell's evaluation points (:func:`write_points`) in
``<out>/tensorboard/<cell>/``, so a grid's runs compare side by side.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

EVENTS_DIR = "tensorboard"
log = logging.getLogger("ps.plots")
# how the records of one kind of file become events: (its path, a record)
_Write = Callable[[Path, dict[str, Any]], None]


def available() -> bool:
    """Whether the ``tensorboard`` package (the optional extra) is installed."""
    return importlib.util.find_spec("tensorboard") is not None


def write_points(logdir: Path, points: list[dict[str, Any]]) -> None:
    """An experiment cell's evaluation ``points`` (round, top1, top3, loss) as
    ``test/*`` scalars in ``logdir``."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(logdir))
    try:
        for p in points:
            for key in ("top1", "top3", "loss"):
                value = p.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    writer.add_scalar(f"test/{key}", value, p["round"])
    finally:
        writer.close()


def run_events(run_dir: Path, every: int = 10,
               logdir: Path | None = None) -> RunEvents | None:
    """A :class:`RunEvents` for ``run_dir`` writing the per-round series every ``every``
    rounds, if TensorBoard is installed and ``every`` > 0, else None."""
    return RunEvents(run_dir, every, logdir) if every > 0 and available() else None


def _notable(record: dict[str, Any]) -> bool:
    """A shard's round worth its point whatever the sampling: workers missing from it, or
    non-finite values in it."""
    return bool(record.get("missing")) or bool(record.get("nonfinite_values"))


class RunEvents:
    """The event files of the run in ``run_dir`` (in ``logdir``, by default
    ``run_dir/tensorboard``), fed from its metrics files."""

    def __init__(self, run_dir: Path, every: int = 10, logdir: Path | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        if every < 1:
            raise ValueError(f"every must be at least 1, got {every}")
        self.run_dir = run_dir
        self.every = every
        self.writer = SummaryWriter(log_dir=str(logdir or run_dir / EVENTS_DIR))
        self.offsets: dict[Path, int] = {}
        self.restarts = 0
        self.failed = False

    def update(self, restarts: int | None = None, round_: int = 0) -> None:
        """Write what the metrics files gained since the last call (whole lines only),
        and ``restarts`` (processes restarted so far) at ``round_`` if it grew. Event
        files that cannot be written (a full disk) are a warning, once, never the run's
        failure: the events stop there."""
        if self.failed:
            return
        try:
            for path, write in self._files():
                sampled = write != self._evaluation
                for record in self._new_lines(path):
                    if not sampled or record["round"] % self.every == 0 or _notable(record):
                        write(path, record)
            if restarts is not None and restarts > self.restarts:
                self.restarts = restarts
                self.writer.add_scalar("cluster/restarts", restarts, round_)
            self.writer.flush()
        except OSError as exc:
            self.failed = True
            log.warning("TensorBoard events of %s not written any more: %s", self.run_dir, exc)

    def close(self) -> None:
        self.writer.close()

    def _files(self) -> list[tuple[Path, _Write]]:
        run = self.run_dir
        found: list[tuple[Path, _Write]] = [
            (p, write) for p, write in ((run / "evaluator.jsonl", self._evaluation),
                                        (run / "engine.jsonl", self._engine))
            if p.exists()]
        for prefix, write in (("worker", self._worker), ("server", self._server),
                              ("proxy", self._proxy)):
            found += [(p, write) for p in sorted(run.glob(f"{prefix}-*.jsonl"))]
        return found

    def _new_lines(self, path: Path) -> list[dict[str, Any]]:
        """The complete JSON lines of ``path`` past its offset (a line still being
        written waits for the next call)."""
        try:
            with path.open("rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        self.offsets[path] = self.offsets.get(path, 0) + end
        records = []
        for line in data[:end].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("round"), int):
                records.append(record)
        return records

    def _scalar(self, tag: str, value: Any, step: int) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            self.writer.add_scalar(tag, value, step)

    def _evaluation(self, _path: Path, r: dict[str, Any]) -> None:
        for key in ("top1", "top3", "loss"):
            self._scalar(f"test/{key}", r.get(key), r["round"])

    def _worker(self, path: Path, r: dict[str, Any]) -> None:
        who = path.stem
        self._scalar(f"train/loss/{who}", r.get("loss"), r["round"])
        self._scalar(f"time/compute_ms/{who}", r.get("compute_ms"), r["round"])
        self._scalar(f"time/exchange_ms/{who}", r.get("exchange_ms"), r["round"])

    def _server(self, path: Path, r: dict[str, Any]) -> None:
        shard = f"shard-{path.stem.split('-', 1)[1]}"
        self._scalar(f"server/aggregation_ms/{shard}", r.get("aggregation_ms"), r["round"])
        self._scalar(f"server/lr/{shard}", r.get("lr"), r["round"])
        self._scalar(f"server/nonfinite_values/{shard}", r.get("nonfinite_values"),
                     r["round"])
        if isinstance(r.get("missing"), list):
            self._scalar(f"server/missing_workers/{shard}", len(r["missing"]), r["round"])

    def _engine(self, _path: Path, r: dict[str, Any]) -> None:
        times = r.get("aggregation_ms")
        for s, ms in enumerate(times if isinstance(times, list) else []):
            self._scalar(f"server/aggregation_ms/shard-{s}", ms, r["round"])
            self._scalar(f"server/lr/shard-{s}", r.get("lr"), r["round"])
        self._scalar("proxy/corrupted_values/engine", r.get("corrupted_values"), r["round"])

    def _proxy(self, path: Path, r: dict[str, Any]) -> None:
        self._scalar(f"proxy/corrupted_values/{path.stem}", r.get("corrupted_values"),
                     r["round"])
