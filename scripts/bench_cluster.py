"""Start-up, memory and throughput of a local cluster against the in-process reference
engine, measured in one run and printed as one table:

* launch of ``ps-cluster`` (a fresh process, as a user starts it) to the end of round 0,
  and where that time went (the forking launcher's imports, kernels and dataset; the
  servers ready; every process started);
* peak PSS of all processes (the launcher and its children, sampled every 0.2 s);
* steady rounds/s (the servers' timestamps, start-up excluded) for each number of
  servers, the reference engine's (one process, one thread) and the ratios.

    python3 scripts/bench_cluster.py                               # S = 1, 4, 20; fork
    python3 scripts/bench_cluster.py --shards 4 --start fork,exec  # both start methods
    python3 scripts/bench_cluster.py --model cnn --dataset synthetic --shards 4
    python3 scripts/bench_cluster.py --shards 4 --d-models mlp,cnn,wide  # + scaling in d

Scaling in d (``--d-models``): the same cluster (S = 4) with each model for
``--d-rounds`` rounds, against what the machine can do. The floor of a round is the
bytes every server moves (n pushes in, n replies out, of d/S float32 each) at the wire
framing's ceiling measured in the same run (``scripts/bench_wire.py``'s, with CURVE
unless ``--insecure``: one encrypting and one decrypting process, so both cores), plus
the n gradients and the S aggregations, each timed alone in this process (one thread),
spread over the machine's cores.

The messaging floor (``scripts/bench_floor.py``): for each S, a synthetic cluster with
the same n, d, CURVE and message pattern whose workers and servers only spin for the
gradient and aggregation times measured alone, with almost no Python. It is what any
design with one process and socket per shard can reach here; the table shows the
cluster against it and the floor against the reference engine and across S.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import click
import torch

from common.config import AttackConfig, RunConfig
from common.data import load_dataset
from common.metrics import read_jsonl
from common.model_init import initial_parameters
from common.models import build_model, num_parameters
from common.rules.defence import Defence
from common.rules.pre import RoundContext
from ps.reference.engine import simulate
from worker.trainer import GradientComputer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_floor import Floor, measure_floor  # sibling scripts
from bench_wire import MODES, measure

SAMPLE_S = 0.2


@dataclass
class Measured:
    """One cluster run's figures."""

    label: str
    shards: int
    launch_to_round0_s: float
    startup: dict
    rounds_per_s: float
    peak_pss_mb: float
    wall_s: float
    digest: str
    bytes_in_per_s_per_server: float = 0.0
    extra: dict = field(default_factory=dict)


def pss_mb(pid: int) -> float:
    """Proportional set size of ``pid`` in MB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return 0.0


def children_of(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (the launcher's children, forked or executed)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


class PeakPss(threading.Thread):
    """Samples the summed PSS of a process and its children until stopped."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0.0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(SAMPLE_S):
            total = sum(pss_mb(p) for p in [self.pid, *children_of(self.pid)])
            self.peak = max(self.peak, total)


def run_cluster(args: list[str], out: Path, label: str, shards: int) -> Measured:
    """Start ``ps-cluster`` with ``args`` as a fresh process and measure it."""
    argv = [sys.executable, "-m", "ps.launcher.cli", *args, "--out-dir", str(out)]
    launched = time.time()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sampler = PeakPss(process.pid)
    sampler.start()
    _, stderr = process.communicate()
    sampler.stopped.set()
    sampler.join()
    if process.returncode != 0:
        raise click.ClickException(f"{label}: ps-cluster exited {process.returncode}:\n"
                                   + stderr.decode(errors="replace")[-3000:])
    summary = json.loads((out / "summary.json").read_text())
    rounds = read_jsonl(out / "server-0.jsonl")
    span = rounds[-1]["time"] - rounds[0]["time"]
    ingested = sum(read_jsonl(out / f"server-{s}.jsonl")[-1]["bytes_in"]
                   for s in range(shards)) / shards
    return Measured(label=label, shards=shards,
                    launch_to_round0_s=rounds[0]["time"] - launched,
                    startup=summary.get("startup", {}),
                    rounds_per_s=summary["rounds_per_s"], peak_pss_mb=sampler.peak,
                    wall_s=time.time() - launched, digest=summary["params_sha256"],
                    bytes_in_per_s_per_server=ingested / span if span > 0 else 0.0)


def reference_rounds_per_s(cfg: RunConfig) -> tuple[float, str]:
    """The in-process reference engine (one thread, as each cluster process) on ``cfg``."""
    torch.set_num_threads(1)
    attack = AttackConfig().validate(cfg)
    result = simulate(cfg, attack, dataset=load_dataset(cfg.dataset, seed=cfg.seed))
    return cfg.rounds / result.seconds, result.digest


@dataclass
class DScaling:
    """One model's run at S = 4 against the machine's floor."""

    model: str
    d: int
    rounds_per_s: float
    mb_in_per_s_per_server: float
    ceiling_mb_per_s: float
    message_mb: float
    compute_ms: float  # one gradient, measured alone
    aggregation_ms: float  # one shard's aggregation, measured alone
    round_ms: float  # median interval between rounds
    floor_ms: float


def isolated_costs(cfg: RunConfig, data: Any, reps: int = 3) -> tuple[float, float]:
    """(one gradient, one shard's aggregation) in ms, each measured alone in this process
    with one torch thread: their CPU cost, free of the cluster's contention."""
    torch.set_num_threads(1)
    computer = GradientComputer(cfg, data)
    x = initial_parameters(cfg)
    defence = Defence(cfg)
    rows = torch.randn(cfg.num_workers, computer.d // cfg.num_shards)

    def median_ms(step: Any) -> float:
        step()  # warm up (kernels, allocator)
        times = []
        for _ in range(reps):
            began = time.perf_counter()
            step()
            times.append(time.perf_counter() - began)
        return statistics.median(times) * 1e3

    context = RoundContext(cfg.seed)
    return (median_ms(lambda: computer.gradient(x, 0, 0)),
            median_ms(lambda: defence(rows, context)))


def d_scaling(model: str, args: list[str], out: Path, cfg: RunConfig, insecure: bool,
              data: Any) -> DScaling:
    """Run the cluster with ``model`` and compare its rounds with the floor."""
    measured = run_cluster([*args, "--model", model, "--shards", str(cfg.num_shards)], out,
                           f"d: {model}", cfg.num_shards)
    d = num_parameters(build_model(model, tuple(data.train_x.shape[1:]), data.num_classes, 0))
    times = [r["time"] for r in read_jsonl(out / "server-0.jsonl")]
    round_ms = statistics.median(b - a for a, b in itertools.pairwise(times)) * 1e3
    compute_ms, aggregation_ms = isolated_costs(cfg, data)
    message_mb = d / cfg.num_shards * 4 / 1e6
    ceiling = measure(MODES[0], message_mb, max(5, int(400 / message_mb)),
                      curve=not insecure) * 1e3  # MB/s
    wire_mb = 2 * cfg.num_workers * d * 4 / 1e6  # every push in, every reply out
    cores = os.cpu_count() or 1
    floor_ms = (wire_mb / ceiling * 1e3
                + (cfg.num_workers * compute_ms + cfg.num_shards * aggregation_ms) / cores)
    return DScaling(model, d, measured.rounds_per_s, measured.bytes_in_per_s_per_server / 1e6,
                    ceiling, message_mb, compute_ms, aggregation_ms, round_ms, floor_ms)


def _print_d_table(rows: list[DScaling]) -> None:
    click.echo("\nscaling in d (S=4): the floor is the wire share (2 n d float32 at the "
               "ceiling) plus n gradients and S aggregations over the cores")
    click.echo("| model | d | rounds/s | MB/s in per server | wire ceiling at d/S | "
               "gradient alone | aggregation alone | round (median) | floor | "
               "round / floor |")
    click.echo("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        click.echo(f"| {r.model} | {r.d:,} | {r.rounds_per_s:.2f} | "
                   f"{r.mb_in_per_s_per_server:.0f} | {r.ceiling_mb_per_s:.0f} MB/s "
                   f"({r.message_mb:.2f} MB) | {r.compute_ms:.1f} ms | "
                   f"{r.aggregation_ms:.1f} ms | {r.round_ms:.0f} ms | {r.floor_ms:.0f} ms | "
                   f"{r.round_ms / r.floor_ms:.2f} |")


@click.command(context_settings={"show_default": True})
@click.option("--workers", default=20, type=int)
@click.option("--shards", default="1,4,20", help="Numbers of servers, comma-separated.")
@click.option("--rule", default="marmed")
@click.option("--model", default="mlp")
@click.option("--dataset", default="fashion-mnist")
@click.option("--rounds", default=300, type=int)
@click.option("--start", default="fork", help="Start methods to compare: fork, exec or both "
              "(fork,exec).")
@click.option("--insecure", is_flag=True, help="Without CURVE keys (default: with, as "
              "ps-cluster runs by default).")
@click.option("--d-models", default="", help="Also measure scaling in d at S=4 with these "
              "models, comma-separated (mlp, cnn, wide: 10.6M parameters).")
@click.option("--d-rounds", default=8, type=int, help="Rounds of each --d-models run.")
@click.option("--json", "json_path", default=None, type=click.Path(path_type=Path))
def main(workers: int, shards: str, rule: str, model: str, dataset: str, rounds: int,
         start: str, insecure: bool, d_models: str, d_rounds: int,
         json_path: Path | None) -> None:
    runs: list[Measured] = []
    for method in start.split(","):
        for s in (int(x) for x in shards.split(",")):
            args = ["--workers", str(workers), "--shards", str(s), "--rule", rule, "--model",
                    model, "--dataset", dataset, "--rounds", str(rounds), "--no-evaluator",
                    "--start", method, *(["--insecure"] if insecure else [])]
            with tempfile.TemporaryDirectory() as tmp:
                label = f"S={s} {method}"
                click.echo(f"running {label} ...", err=True)
                runs.append(run_cluster(args, Path(tmp) / "run", label, s))
    base = next((r for r in runs if r.shards == 4), runs[0])
    cfg = RunConfig(dataset=dataset, model=model, num_workers=workers, num_shards=base.shards,
                    rule=rule, rounds=rounds).validate()
    reference, digest = reference_rounds_per_s(cfg)
    _print_table(runs, reference, digest, base)
    floors = messaging_floors(runs, cfg, insecure)
    _print_floor_table(runs, floors, reference)
    scaling = []
    for name in filter(None, d_models.split(",")):
        args = ["--workers", str(workers), "--rule", rule, "--dataset", dataset, "--rounds",
                str(d_rounds), "--no-evaluator", *(["--insecure"] if insecure else [])]
        with tempfile.TemporaryDirectory() as tmp:
            click.echo(f"running d: {name} ...", err=True)
            cfg = RunConfig(dataset=dataset, model=name, num_workers=workers, num_shards=4,
                            rule=rule).validate()
            scaling.append(d_scaling(name, args, Path(tmp) / "run", cfg, insecure,
                                     load_dataset(dataset, seed=0)))
    if scaling:
        _print_d_table(scaling)
    if json_path:
        json_path.write_text(json.dumps({"reference_rounds_per_s": reference,
                                         "runs": [r.__dict__ for r in runs],
                                         "floors": [f.__dict__ for f in floors.values()],
                                         "d_scaling": [r.__dict__ for r in scaling]},
                                        indent=2))


def messaging_floors(runs: list[Measured], cfg: RunConfig, insecure: bool) -> dict[int, Floor]:
    """The messaging floor for each S that ran, with this model's gradient and each
    S's aggregation as measured alone."""
    data = load_dataset(cfg.dataset, seed=cfg.seed)
    d = num_parameters(build_model(cfg.model, tuple(data.train_x.shape[1:]),
                                   data.num_classes, 0))
    floors = {}
    compute_ms = isolated_costs(cfg, data, reps=50)[0]  # the same at every S
    for shards in sorted({r.shards for r in runs}):
        click.echo(f"measuring the messaging floor at S={shards} ...", err=True)
        aggregation_ms = isolated_costs(replace(cfg, num_shards=shards), data, reps=50)[1]
        floors[shards] = measure_floor(cfg.num_workers, shards, d, not insecure, compute_ms,
                                       aggregation_ms)
    return floors


def _print_floor_table(runs: list[Measured], floors: dict[int, Floor],
                       reference: float) -> None:
    click.echo("\nthe messaging floor (scripts/bench_floor.py): the same n, d, CURVE and "
               "message pattern, workers and servers only spinning for the gradient and "
               "aggregation times measured alone")
    click.echo("| run | rounds/s | floor rounds/s | / floor | floor CPU per round | "
               "gradient / aggregation alone |")
    click.echo("|---|---|---|---|---|---|")
    for r in runs:
        f = floors[r.shards]
        click.echo(f"| {r.label} | {r.rounds_per_s:.1f} | {f.rounds_per_s:.1f} | "
                   f"{r.rounds_per_s / f.rounds_per_s:.2f} | {f.cpu_ms_per_round:.0f} ms | "
                   f"{f.compute_ms:.2f} / {f.aggregate_ms:.2f} ms |")
    if 4 in floors:
        click.echo(f"floor at S=4 / reference engine = "
                   f"{floors[4].rounds_per_s / reference:.2f}")
    if 4 in floors and 20 in floors:
        click.echo(f"floor at S=20 / floor at S=4 = "
                   f"{floors[20].rounds_per_s / floors[4].rounds_per_s:.2f}")


def _print_table(runs: list[Measured], reference: float, digest: str, base: Measured) -> None:
    click.echo("")
    click.echo("| run | launch to end of round 0 | imports / kernels / dataset in the "
               "launcher | servers ready / all started | steady rounds/s | / reference "
               "| peak PSS, all processes | MB/s in per server |")
    click.echo("|---|---|---|---|---|---|---|---|")
    for r in runs:
        prep = r.startup.get("prepare", {})
        prepared = (f"{prep.get('imports_s', 0):.2f} / {prep.get('kernels_s', 0):.2f} / "
                    f"{prep.get('dataset_s', 0):.2f} s" if prep else "- (each child)")
        click.echo(f"| {r.label} | {r.launch_to_round0_s:.2f} s | {prepared} | "
                   f"{r.startup.get('servers_ready_s', 0):.2f} / "
                   f"{r.startup.get('all_started_s', 0):.2f} s | {r.rounds_per_s:.1f} | "
                   f"{r.rounds_per_s / reference:.2f} | {r.peak_pss_mb / 1024:.2f} GB | "
                   f"{r.bytes_in_per_s_per_server / 1e6:.0f} |")
    click.echo(f"| reference engine (1 process, 1 thread, S={base.shards}) | - | - | - | "
               f"{reference:.1f} | 1.00 | - | - |")
    by_s = {r.shards: r for r in runs if r.label.endswith("fork")} or {r.shards: r
                                                                          for r in runs}
    if 4 in by_s and 20 in by_s:
        click.echo(f"\nscaling in S: rounds/s at S=20 / S=4 = "
                   f"{by_s[20].rounds_per_s / by_s[4].rounds_per_s:.2f}")
    click.echo(f"final parameters of {base.label} bit-identical to the reference engine: "
               f"{base.digest == digest}")


if __name__ == "__main__":
    main()
