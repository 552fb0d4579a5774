"""What the chaos run measures and prints: the nodes' VmRSS and VmHWM sampled every
``SAMPLE_S`` with the peaks kept per phase (:class:`Sampler`), the round a metrics file
has reached, a rotated log's bytes, the keys and held bytes its lines name, the shards'
sizes (the targets' push lengths), and the table of the flood classes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import threading
import time
from pathlib import Path

import click

from common.run.config import RunConfig

SAMPLE_S = 0.02  # RSS sampling interval


def status_kb(pid: int, field_name: str) -> int:
    """Field ``field_name`` (``VmRSS``, ``VmHWM``) of process ``pid``'s status, in kB (0
    once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class Sampler(threading.Thread):
    """VmRSS and VmHWM of the nodes every ``SAMPLE_S``, the peaks kept per phase."""

    def __init__(self, pids: dict[str, int]) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self.pids = pids
        self.baseline = {n: status_kb(p, "VmRSS") for n, p in pids.items()}
        self.hwm_before = {n: status_kb(p, "VmHWM") for n, p in pids.items()}
        self.phase = "start"
        self.peaks: dict[str, dict[str, int]] = {"start": dict(self.baseline)}
        self.hwm_at: dict[str, dict[str, int]] = {"start": dict(self.hwm_before)}
        self.overall = dict(self.baseline)
        self.peak_at: dict[str, tuple[str, float]] = {}  # name -> (phase, seconds in)
        self.started = self.phase_started = time.monotonic()
        self.samples = 0
        self.halt = threading.Event()

    def mark(self, phase: str) -> None:
        self.hwm_at[phase] = {n: status_kb(p, "VmHWM") for n, p in self.pids.items()}
        self.peaks[phase] = {n: status_kb(p, "VmRSS") for n, p in self.pids.items()}
        self.phase, self.phase_started = phase, time.monotonic()

    def run(self) -> None:
        while not self.halt.wait(SAMPLE_S):
            peaks = self.peaks[self.phase]
            for name, pid in self.pids.items():
                rss = status_kb(pid, "VmRSS")
                peaks[name] = max(peaks[name], rss)
                if rss > self.overall[name]:
                    self.overall[name] = rss
                    self.peak_at[name] = (self.phase, time.monotonic() - self.phase_started)
            self.samples += 1

    def growth_mb(self, phase: str | None = None) -> dict[str, float]:
        peaks = self.overall if phase is None else self.peaks[phase]
        return {n: round((peaks[n] - self.baseline[n]) / 1024, 1) for n in self.pids}

    def hwm_growth_mb(self, since: str, until: str | None = None) -> dict[str, float]:
        end = self.hwm_at[until] if until else {n: status_kb(p, "VmHWM")
                                                for n, p in self.pids.items()}
        return {n: round(max(0, end[n] - self.hwm_at[since][n]) / 1024, 1) for n in self.pids}


def last_round(metrics: Path) -> int:
    """The round after the last one a metrics file records (its last 8 KB are read)."""
    try:
        with metrics.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
            lines = f.read().decode(errors="replace").splitlines()
    except FileNotFoundError:
        return 0
    for line in reversed(lines):
        with contextlib.suppress(json.JSONDecodeError):
            return json.loads(line)["round"] + 1
    return 0


def log_bytes(path: Path) -> dict:
    """Bytes of a rotated log: the file and its backups (``.1``, ``.2``)."""
    files = [p for p in (path, *(path.with_name(f"{path.name}.{i}") for i in (1, 2, 3)))
             if p.exists()]
    return {"bytes": sum(p.stat().st_size for p in files), "files": [p.name for p in files]}


def barred_in_log(path: Path) -> list[str]:
    """The keys a node's log says it barred (the proxy writes no metrics line with them)."""
    found = set()
    for p in (path.with_name(f"{path.name}.2"), path.with_name(f"{path.name}.1"), path):
        with contextlib.suppress(OSError):
            for line in p.read_text(errors="replace").splitlines():
                if "barred " in line and " for the rest of the run" in line:
                    found.add(line.split("barred ", 1)[1].split(" for the rest")[0])
    return sorted(found)


def holds_in_log(path: Path) -> dict:
    """The bytes a cut connection held, as the node's log lines of its cuts say."""
    held = []
    for p in (path.with_name(f"{path.name}.2"), path.with_name(f"{path.name}.1"), path):
        with contextlib.suppress(OSError):
            held += [int(m.replace(",", "")) for m in
                     re.findall(r"held ([0-9,]+) bytes", p.read_text(errors="replace"))]
    return {"lines": len(held), "max_mb": round(max(held, default=0) / 2**20, 1),
            "median_mb": round(statistics.median(held) / 2**20, 1) if held else 0.0}


def shard_sizes(cfg: RunConfig) -> list[int]:
    from common.learn.data import dataset_spec
    from common.learn.models import build_model, num_parameters
    from common.net.sharding import shard_ranges

    spec = dataset_spec(cfg.dataset)
    d = num_parameters(build_model(cfg.model, spec.input_shape, spec.num_classes, cfg.seed))
    return [stop - start for start, stop in shard_ranges(d, cfg.num_shards)]


def print_table(classes: list[dict]) -> None:
    click.echo(f"{'target':9} {'class':20} {'frames':>9} {'messages':>8} {'answered':>8} "
               f"{'no reply':>8} {'dropped':>8}  replies")
    for c in classes:
        replies = ", ".join(f"{k} {n:,}" for k, n in sorted(c["replies"].items())) or "none"
        dropped = "?" if c["unanswered_by_node"] is None else f"{c['unanswered_by_node']:,}"
        click.echo(f"{c['target']:9} {c['class']:20} {c['frames']:>9,} {c['messages']:>8,} "
                   f"{c['answered']:>8,} {c['no_reply']:>8,} {dropped:>8}  {replies}")
