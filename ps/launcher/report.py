"""What a cluster run reports: its progress (read from the metrics files), its
start-up figures, its result and ``summary.json``, written on every end."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from common.errors import EXIT_INTERRUPTED, EXIT_PEER, ClusterTimeout, ConfigError, Interrupted
from common.run.metrics import read_jsonl
from server.checkpoint import params_digest


@dataclass
class Progress:
    """What the launcher knows about the run so far (from the metrics files)."""

    round: int = 0
    rounds_per_s: float = 0.0  # timed_rounds / span_s
    timed_rounds: int = 0  # rounds ended after server 0's first one (start-up excluded)
    span_s: float = 0.0  # from the end of that first round to the end of the last
    restarts: int = 0
    eval_round: int | None = None
    top1: float | None = None
    top3: float | None = None
    loss: float | None = None


@dataclass
class ClusterResult:
    """Outcome of a finished cluster run."""

    out_dir: Path
    seconds: float
    progress: Progress
    params: np.ndarray
    digest: str
    evaluations: list[dict] = field(default_factory=list)


def read_progress(out: Path, restarts: int = 0) -> Progress:
    """The progress of the run in ``out``, from server 0's and the evaluator's metrics;
    ``restarts``: how many restarts the launcher made."""
    rounds = read_jsonl(out / "server-0.jsonl")
    progress = Progress(restarts=restarts)
    if rounds:
        progress.round = rounds[-1]["round"] + 1
        if len(rounds) > 1:
            span = rounds[-1]["time"] - rounds[0]["time"]
            progress.timed_rounds, progress.span_s = len(rounds) - 1, span
            progress.rounds_per_s = (len(rounds) - 1) / span if span > 0 else 0.0
    evals = read_jsonl(out / "evaluator.jsonl")
    if evals:
        last = evals[-1]
        progress.eval_round = last["round"]
        progress.top1, progress.top3, progress.loss = last["top1"], last["top3"], last["loss"]
    return progress


def outcome(exc: BaseException) -> str:
    """A word for how a run that raised ``exc`` ended."""
    if isinstance(exc, (Interrupted, KeyboardInterrupt)):
        return "interrupted"
    if isinstance(exc, ClusterTimeout):
        return "timeout"
    if isinstance(exc, ConfigError):
        return "configuration-error"
    return "failed"


class RunReport:
    """The clock and the figures of one run in ``out``, and its ``summary.json``.

    ``startup`` holds seconds from :meth:`begin` to each start-up step (``prepare``:
    the fork launcher's imports, kernels and dataset, as a dict of its own)."""

    def __init__(self, out: Path, rounds: int) -> None:
        self.out = out
        self.rounds = rounds  # the run's T
        self.started = 0.0  # time.monotonic() at begin()
        self.launched = 0.0  # time.time() at begin(): the metrics' clock
        self.startup: dict[str, Any] = {}

    def begin(self) -> None:
        """The run starts now."""
        self.started = time.monotonic()
        self.launched = time.time()

    def mark(self, step: str) -> None:
        """Start-up step ``step`` (``servers_ready_s``, ``all_started_s``) is done now."""
        self.startup[step] = round(time.time() - self.launched, 3)

    def seconds(self) -> float:
        """Wall seconds since :meth:`begin` (0 before it)."""
        return time.monotonic() - self.started if self.started else 0.0

    def finished(self, params: np.ndarray, restarts: list[dict[str, Any]],
                 lost: list[str], after_end: list[str] | None = None) -> ClusterResult:
        """The result of a run that ended with ``params``; writes its summary
        (``after_end``: the worker processes that failed once the servers had finished)."""
        result = ClusterResult(
            out_dir=self.out,
            seconds=self.seconds(),
            progress=read_progress(self.out, len(restarts)),
            params=params,
            digest=params_digest(params),
            evaluations=read_jsonl(self.out / "evaluator.jsonl"),
        )
        self.write_summary("finished", "", 0, restarts, lost, **{
            "rounds_per_s": result.progress.rounds_per_s,
            "final_top1": result.progress.top1,
            "final_top3": result.progress.top3,
            "final_loss": result.progress.loss,
            "params_sha256": result.digest,
            "params_finite": bool(np.isfinite(params).all()),
            "failed_after_servers_finished": after_end or [],
        })
        return result

    def failed(self, exc: BaseException, restarts: list[dict[str, Any]],
               lost: list[str]) -> None:
        """Writes the summary of a run that raised ``exc``: its first line as the reason,
        its exit code (130 for Ctrl-C)."""
        code = (EXIT_INTERRUPTED if isinstance(exc, KeyboardInterrupt)
                else getattr(exc, "exit_code", EXIT_PEER))
        self.write_summary(outcome(exc), getattr(exc, "reason", str(exc).split("\n")[0]),
                           code, restarts, lost)

    def write_summary(self, how: str, reason: str, exit_code: int,
                      restarts: list[dict[str, Any]], lost: list[str], **extra: Any) -> None:
        """``summary.json``: how the run ended and why, its restarts, the workers it
        went on without, and its figures."""
        rounds = read_jsonl(self.out / "server-0.jsonl")
        summary = {
            "outcome": how,
            "reason": reason,
            "exit_code": exit_code,
            "seconds": round(self.seconds(), 2),
            "rounds": self.rounds,
            "rounds_done": read_progress(self.out).round,
            "restarts": restarts,
            "lost": lost,
            "rounds_closed_at_deadline_shard0": sum(bool(r.get("missing")) for r in rounds),
            "startup": self.startup_figures(),
            **extra,
        }
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n",
                                               encoding="utf-8")

    def startup_figures(self) -> dict[str, Any]:
        """The start-up steps, and the end of round 0 once every process started."""
        figures = dict(self.startup)
        rounds = read_jsonl(self.out / "server-0.jsonl")
        if rounds and "all_started_s" in self.startup:
            figures["round0_done_s"] = round(rounds[0]["time"] - self.launched, 3)
        return figures
