"""What a worker that is gone costs: rounds/s of a keyed cluster with a round deadline and
a quorum before and after one worker is killed (SIGKILL, not restarted).

A server that closed a round at its deadline without a worker treats it as absent and
closes later rounds as soon as every present worker has pushed, so the kill costs one
deadline, not one per round. Printed: the rounds/s before and after the kill (measured
from server 0's metrics: the rounds' end times), their ratio, and how each round after
the kill closed (``closed``: ``deadline`` / ``present`` / ``all``).

    python3 scripts/bench_absent.py                     # n=6, S=2, deadline 2 s, quorum 5
    python3 scripts/bench_absent.py --rounds 400 --kill-at 150
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from collections import Counter
from pathlib import Path

import click

from common.net.keys import SecurityOptions
from common.run.config import AttackConfig, RunConfig
from common.run.metrics import read_jsonl
from ps.launcher.cluster import BackgroundRun, Cluster, ClusterSpec
from ps.launcher.options import ClusterOptions
from ps.launcher.report import ClusterResult
from server.options import ServerOptions
from worker.options import ClientOptions


def _rate(lines: list[dict], first: int, last: int) -> float:
    """Rounds per second from the end of round ``first`` to the end of round ``last``."""
    times = {r["round"]: r["time"] for r in lines}
    return (last - first) / (times[last] - times[first])


@click.command(context_settings={"show_default": True})
@click.option("--workers", default=6, type=int)
@click.option("--shards", default=2, type=int)
@click.option("--rounds", default=300, type=int)
@click.option("--kill-at", default=100, type=int, help="Round at which worker --victim dies.")
@click.option("--victim", default=4, type=int)
@click.option("--round-timeout", default=2.0, type=float)
@click.option("--quorum", default=5, type=int)
@click.option("--dataset", default="fashion-mnist")
@click.option("--json", "json_path", default=None, type=click.Path(path_type=Path))
def main(workers: int, shards: int, rounds: int, kill_at: int, victim: int,
         round_timeout: float, quorum: int, dataset: str, json_path: Path | None) -> None:
    cfg = RunConfig(dataset=dataset, num_workers=workers, num_shards=shards, rule="marmed",
                    rounds=rounds, seed=1).validate()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        spec = ClusterSpec(cfg=cfg, attack=AttackConfig().validate(cfg), out_dir=out,
                           client=ClientOptions(timeout_s=30.0),
                           cluster=ClusterOptions(max_restarts=0, no_evaluator=True,
                                                  worker_processes=workers),  # one each
                           server=ServerOptions(round_timeout=str(round_timeout), quorum=quorum),
                           security=SecurityOptions())
        report = _measure(spec, kill_at, f"worker-{victim}")
    click.echo(json.dumps(report, indent=2))
    if json_path:
        json_path.write_text(json.dumps(report, indent=2) + "\n")
    raise SystemExit(0 if report["run_finished"] else 1)


def _measure(spec: ClusterSpec, kill_at: int, victim: str) -> dict:
    run = BackgroundRun(Cluster(spec))
    metrics = spec.out_dir / "server-0.jsonl"
    while run.alive and len(read_jsonl(metrics)) < kill_at:
        time.sleep(0.05)
    process = run.process(victim)
    if process is None:
        raise click.ClickException(f"{victim} is not running at round {kill_at}")
    killed_at = len(read_jsonl(metrics))
    os.kill(process.pid, signal.SIGKILL)
    click.echo(f"killed {victim} at round {killed_at}", err=True)
    outcome = run.join()
    lines = read_jsonl(metrics)
    last = lines[-1]["round"]
    warm = min(20, killed_at // 4)
    before = _rate(lines, warm, killed_at - 1)
    after = _rate(lines, killed_at + 2, last)
    return {
        "workers": spec.cfg.num_workers, "shards": spec.cfg.num_shards,
        "round_timeout": spec.server.round_timeout, "quorum": spec.server.quorum,
        "killed_at_round": killed_at,
        "rounds_per_s_before": round(before, 2),
        "rounds_per_s_after": round(after, 2),
        "after_over_before": round(after / before, 3),
        "closed_after_kill": dict(Counter(r.get("closed", "?") for r in lines
                                          if r["round"] >= killed_at)),
        "run_finished": isinstance(outcome, ClusterResult),
    }


if __name__ == "__main__":
    main()
