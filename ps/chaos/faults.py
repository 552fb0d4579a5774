"""Faults on a schedule: one supervised cluster run (``ps-cluster`` with a round deadline
and a quorum, a gambler proxy) during which a random worker, the proxy and a server are
killed with SIGKILL, one after the other (the command: ``ps.chaos.cli.faults``).

It prints the faults injected, the launcher's restarts, the rounds the servers closed
at their deadline without some workers, the final top-1 against the same run without
faults (the reference engine), and whether the reference engine, replaying the
participation the servers recorded, ends bit-identical to the cluster.

    python3 scripts/chaos_faults.py                 # 8 workers, 4 servers, 300 rounds
    python3 scripts/chaos_faults.py --rounds 120    # quicker
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import click

from common.learn.data import run_dataset
from common.run.metrics import read_jsonl
from common.run.process import pin_torch_threads
from ps.launcher.cluster import BackgroundRun, Cluster, ClusterSpec
from ps.launcher.report import ClusterResult
from ps.reference.engine import simulate
from ps.reference.participation import read_participation
from worker.evaluator import Evaluator


def _round(out: Path) -> int:
    lines = read_jsonl(out / "server-0.jsonl")
    return lines[-1]["round"] + 1 if lines else 0


def run_with_faults(spec: ClusterSpec, schedule: list[tuple[int, str]]) -> dict:
    cfg, out = spec.cfg, spec.out_dir
    started = time.monotonic()
    run = BackgroundRun(Cluster(spec))
    injected = []
    for at_round, name in schedule:
        while run.alive and _round(out) < at_round:
            time.sleep(0.1)
        process = run.process(name)
        if not run.alive or process is None or process.pid is None:
            continue
        os.kill(process.pid, signal.SIGKILL)
        injected.append({"process": name, "at_round": _round(out)})
        click.echo(f"killed {name} at round {_round(out)}", err=True)
    result = run.join()
    seconds = time.monotonic() - started
    summary = json.loads((out / "summary.json").read_text())
    report = {
        "faults": injected,
        "restarts": summary.get("restarts", []),
        "lost": summary.get("lost", []),
        "run_finished": isinstance(result, ClusterResult),
        "outcome": summary.get("outcome"),
        "reason": summary.get("reason"),
        "seconds": round(seconds, 1),
        "bit_identical": False,
    }
    if not isinstance(result, ClusterResult):
        return report
    participation = read_participation(out, cfg.num_shards, cfg.num_workers, cfg.rounds)
    closed = [sum(bool(r["missing"]) for r in read_jsonl(out / f"server-{s}.jsonl"))
              for s in range(cfg.num_shards)]
    pin_torch_threads(1)  # as the workers compute
    dataset = run_dataset(cfg)
    replayed = simulate(cfg, spec.attack, dataset=dataset, participation=participation)
    clean = simulate(cfg, spec.attack, dataset=dataset)
    evaluator = Evaluator(cfg, dataset, 512)
    report.update({
        "rounds_closed_at_deadline_per_shard": closed,
        "final_top1": round(evaluator.evaluate(result.params).top1, 4),
        "final_top1_without_faults": round(evaluator.evaluate(clean.params).top1, 4),
        "bit_identical": replayed.digest == result.digest,
    })
    return report
