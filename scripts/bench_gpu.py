"""The cluster on a GPU against the reference engine on the same GPU, with a per-round
split of where the time goes (``scripts/gpu_check.sh`` runs it; ``--device cpu`` runs
the same measurement on the CPU, to check the script itself on a machine without one).

For ResNet-18 (GroupNorm, 11.2M parameters) on synthetic CIFAR-shaped data, n=20, S=4,
MarMed, by default:

* the reference engine on the device (one process; its workers' gradients on the GPU,
  the aggregation on the CPU): steady rounds/s;
* ``ps-cluster --device ...`` with CURVE keys and with ``--insecure``: steady rounds/s
  (server 0's rounds from ``--steady-from`` on), and the ratio to the engine;
* the split of a round: compute (one gradient on the device, x loaded and the gradient
  copied out included, times the workers a process runs one after the other), the
  host-device copies (one x in from pinned memory and one gradient out, timed alone with
  CUDA events, times the same), the aggregation (each server process's shards, from
  ``server-<s>.jsonl``), and the wire (the rest of the round: sending, encrypting,
  waiting).

    python3 scripts/bench_gpu.py --out docs/results/gpu
    python3 scripts/bench_gpu.py --device cpu --model mlp --dataset synthetic --rounds 12
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import torch

from common.learn.data import load_dataset
from common.run.buffers import HostBuffers
from common.run.config import AttackConfig, RunConfig
from common.run.metrics import read_jsonl
from common.run.model_init import initial_parameters
from ps.launcher.options import ClusterOptions
from ps.reference.engine import simulate
from worker.device import describe, resolve_device
from worker.trainer import GradientComputer

TARGET = 0.8  # the cluster with keys / the engine on the same device


@dataclass
class Split:
    """Milliseconds of a round of the cluster, by where they go."""

    round_ms: float
    compute_ms: float
    copies_ms: float
    aggregation_ms: float
    wire_ms: float


@dataclass
class ClusterRun:
    security: str
    rounds_per_s: float
    split: Split
    digest: str


def steady_rate(times: list[float], steady_from: int) -> float:
    """Rounds/s between round ``steady_from``'s timestamp and the last."""
    window = times[min(steady_from, len(times) - 2):]
    return (len(window) - 1) / (window[-1] - window[0])


def engine_rate(cfg: RunConfig, device: torch.device, steady_from: int) -> tuple[float, str]:
    """(steady rounds/s, final digest) of the reference engine on ``device``."""
    torch.set_num_threads(1)
    stamps: dict[int, float] = {}

    def on_round(t: int, _: Any) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        stamps[t] = time.perf_counter()

    result = simulate(cfg, AttackConfig().validate(cfg), on_round=on_round, device=device)
    times = [stamps[t] for t in sorted(stamps)]
    return steady_rate(times, steady_from), result.digest


def gradient_and_copies_ms(cfg: RunConfig, device: torch.device) -> tuple[float, float]:
    """(one gradient on ``device``, x loaded and the gradient copied out included; the
    two copies alone) in ms, medians of a few, after a warm-up."""
    torch.set_num_threads(1)
    computer = GradientComputer(cfg, load_dataset(cfg.dataset, seed=cfg.seed), device)
    pinned = device.type == "cuda"
    x = HostBuffers(computer.d, pinned=pinned).take()
    x[:] = initial_parameters(cfg)
    out = HostBuffers(computer.d, pinned=pinned).take()

    def sync() -> None:
        if pinned:
            torch.cuda.synchronize(device)

    def median_ms(step, reps: int = 7) -> float:
        step()
        sync()
        times = []
        for _ in range(reps):
            began = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - began)
        return statistics.median(times) * 1e3

    fresh = [x.copy() for _ in range(8)]  # a new x each time: loaded, never skipped
    cycle = iter(range(10**9))
    gradient = median_ms(lambda: computer.gradient(fresh[next(cycle) % 8], 0, 0, out=out))
    host_x, host_g = torch.from_numpy(x), torch.from_numpy(out)
    copies = median_ms(lambda: (computer.flat_params.copy_(host_x),
                                host_g.copy_(computer.flat_grads)))
    return gradient, copies


def aggregation_ms(out: Path, blocks: list[tuple[int, ...]], steady_from: int) -> float:
    """The median over the steady rounds of the slowest server process's aggregation
    (the sum of its shards' ``aggregation_ms``)."""
    per_round: dict[int, list[float]] = {}
    for block in blocks:
        totals: dict[int, float] = {}
        for s in block:
            for r in read_jsonl(out / f"server-{s}.jsonl"):
                totals[r["round"]] = totals.get(r["round"], 0.0) + r["aggregation_ms"]
        for t, ms in totals.items():
            per_round.setdefault(t, []).append(ms)
    return statistics.median(max(v) for t, v in per_round.items() if t >= steady_from)


def cluster_run(cfg: RunConfig, device: str, security: str, steady_from: int,
                worker_processes: int | None, gradient_ms: float, copies_ms: float,
                timeout_s: float) -> ClusterRun:
    """``ps-cluster`` on ``device`` with keys or without, and its round's split."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        argv = [sys.executable, "-m", "ps.launcher.cli", "--model", cfg.model, "--dataset",
                cfg.dataset, "--workers", str(cfg.num_workers), "--shards",
                str(cfg.num_shards), "--rule", cfg.rule, "--rounds", str(cfg.rounds),
                "--device", device, "--no-evaluator", "--run-timeout", str(timeout_s),
                "--out-dir", str(out),
                *(["--worker-processes", str(worker_processes)] if worker_processes else []),
                *(["--insecure"] if security == "insecure" else [])]
        click.echo(f"running ps-cluster --device {device} ({security}) ...", err=True)
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise click.ClickException(f"ps-cluster ({security}) exited {done.returncode}:\n"
                                       + done.stderr[-3000:])
        summary = json.loads((out / "summary.json").read_text())
        times = [r["time"] for r in read_jsonl(out / "server-0.jsonl")]
        rate = steady_rate(times, steady_from)
        aggregation = aggregation_ms(out, ClusterOptions().blocks(cfg.num_shards),
                                     steady_from)
    per_process = -(-cfg.num_workers // len(ClusterOptions(
        worker_processes=worker_processes).worker_blocks(cfg.num_workers)))
    round_ms = 1e3 / rate
    compute = gradient_ms * per_process
    copies = copies_ms * per_process
    split = Split(round_ms, compute, copies, aggregation,
                  max(0.0, round_ms - compute - aggregation))
    return ClusterRun(security, rate, split, summary["params_sha256"])


@click.command(context_settings={"show_default": True})
@click.option("--device", default="cuda", help="cuda, cuda:N, or cpu (a check of the "
              "script itself).")
@click.option("--model", default="resnet18")
@click.option("--dataset", default="synthetic-cifar")
@click.option("--workers", default=20, type=int)
@click.option("--shards", default=4, type=int)
@click.option("--rule", default="marmed")
@click.option("--rounds", default=40, type=int)
@click.option("--steady-from", default=10, type=int, help="First round of the steady window.")
@click.option("--worker-processes", default=None, type=int, help="ps-cluster's W (default "
              "its own).")
@click.option("--timeout", "timeout_s", default=240.0, help="Each cluster run's limit (s).")
@click.option("--out", "out_dir", default=None, type=click.Path(path_type=Path),
              help="Write output.md and results.json here.")
def main(device: str, model: str, dataset: str, workers: int, shards: int, rule: str,
         rounds: int, steady_from: int, worker_processes: int | None, timeout_s: float,
         out_dir: Path | None) -> None:
    target = resolve_device(device)
    cfg = RunConfig(model=model, dataset=dataset, num_workers=workers, num_shards=shards,
                    rule=rule, rounds=rounds).validate()
    click.echo(f"measuring one gradient and the copies on {describe(target)} ...", err=True)
    gradient_ms, copies_ms = gradient_and_copies_ms(cfg, target)
    click.echo("running the reference engine ...", err=True)
    engine, engine_digest = engine_rate(cfg, target, steady_from)
    runs = [cluster_run(cfg, device, security, steady_from, worker_processes, gradient_ms,
                        copies_ms, timeout_s) for security in ("keys", "insecure")]
    lines = [f"{model} on {dataset}, n={workers}, S={shards}, {rule}, {rounds} rounds "
             f"(steady from round {steady_from}), on {describe(target)}, CPU "
             f"{torch.get_num_threads()} threads here; one gradient {gradient_ms:.1f} ms "
             f"(of it the host-device copies {copies_ms:.1f} ms)", "",
             "| run | rounds/s | / engine | round | compute | host-device copies | "
             "aggregation | wire and waiting | bit-identical to the engine |",
             "|---|---|---|---|---|---|---|---|---|",
             f"| engine (one process) | {engine:.2f} | 1.00 | {1e3 / engine:.0f} ms | - | - "
             "| - | - | - |"]
    for run in runs:
        s = run.split
        lines.append(f"| cluster, {run.security} | {run.rounds_per_s:.2f} | "
                     f"{run.rounds_per_s / engine:.2f} | {s.round_ms:.0f} ms | "
                     f"{s.compute_ms:.0f} ms | {s.copies_ms:.0f} ms | "
                     f"{s.aggregation_ms:.0f} ms | {s.wire_ms:.0f} ms | "
                     f"{run.digest == engine_digest} |")
    keys = runs[0].rounds_per_s / engine
    lines += ["", f"cluster with keys / engine on the same device: {keys:.2f} (target >= "
              f"{TARGET}: {'met' if keys >= TARGET else 'NOT met'})"]
    text = "\n".join(lines)
    click.echo(text)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "output.md").write_text(text + "\n")
        (out_dir / "results.json").write_text(json.dumps({
            "config": {"model": model, "dataset": dataset, "workers": workers,
                       "shards": shards, "rule": rule, "rounds": rounds,
                       "device": describe(target)},
            "gradient_ms": gradient_ms, "copies_ms": copies_ms,
            "engine_rounds_per_s": engine, "engine_digest": engine_digest,
            "runs": [asdict(r) for r in runs], "keys_over_engine": keys}, indent=2))


if __name__ == "__main__":
    main()
