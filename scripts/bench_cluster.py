"""Start-up, memory, CPU and throughput of a local cluster against the in-process
reference engine, measured in one run and printed as one table per topic:

* launch of ``ps-cluster`` (a fresh process, as a user starts it) to the end of round 0,
  and where that time went (the forking launcher's imports, kernels and dataset; the
  servers ready; every process started);
* peak PSS of all processes (the launcher and its children, sampled every 0.2 s);
* CPU-seconds per round of all processes together (the launcher and its children, each
  with all its threads: ``/proc/<pid>/stat`` utime + stime, sampled with the PSS) in the
  steady window (server-0's round 10 to its last round), against the reference engine's
  (``time.process_time()`` over its rounds from round 10 on; its rounds/s, as the
  cluster's, after round 0, which carries the kernels' warm-up);
* steady rounds/s (the servers' timestamps, start-up excluded) for each layout ``S:P``
  (S shards on P server processes, ``ps-cluster --server-processes P``), with keys and
  without (``--security``), the reference engine's (one process, one thread) and the
  ratios; then the issue's targets as ratios of this run: S=20 on 4 processes / S=4 on
  4 (and S=20 on 20 / S=4 on 4 for comparison), and the cluster at S=4 (its best P) /
  the reference engine, in rounds/s and in CPU per round, with and without keys. Each
  layout runs with the n workers in each of ``--worker-processes`` W processes
  (``ps-cluster --worker-processes``; by default its default, min(n, 2 x cores)): the
  targets take each layout's fastest W.

    python3 scripts/bench_cluster.py             # layouts 4:1,4:2,4:4,20:4,20:20, keys and
                                                 # insecure (every layout in each), fork
    python3 scripts/bench_cluster.py --layouts 4:4,20:4 --security keys
    python3 scripts/bench_cluster.py --shards 4,1,20    # shorthand: layouts 4:4,1:1,20:20
    python3 scripts/bench_cluster.py --layouts 4:4 --start fork,exec  # both start methods
    python3 scripts/bench_cluster.py --model cnn --dataset synthetic --layouts 4:4
    python3 scripts/bench_cluster.py --layouts none --d-models wide,resnet18  # scaling in d
    python3 scripts/bench_cluster.py --n-scaling 20,50,100  # + scaling in n (S=4, keys)
    python3 scripts/bench_cluster.py --layouts 4:2 --rounds 15 --no-floor  # a quick check
    python3 scripts/bench_cluster.py --layouts 4:2 --worker-processes 20,2  # W=n against 2
    python3 scripts/bench_cluster.py --repeats 3     # each layout 3 times: the medians

Every layout runs once per security mode (``--security keys,insecure``, the default:
each layout with keys, then each without; ``--insecure`` is short for ``--security
insecure``) and start method (``--start``). The reference engine (at S=4, or the first
layout's S if none has 4) runs just before each cluster run, in this process, and each
run's ratios are to the reference run beside it: this machine's speed drifts by a third
from minute to minute (a shared VM), which a single reference run would put into every
ratio; the table also gives the reference runs' median and range, and the targets the
ratio to that median. With ``--repeats R`` every layout runs R times (all layouts in
turn, then again), each after its own reference run, and the tables give each layout's
medians: a single run of a layout lands anywhere in a band of about 15%. The final
parameters of every S=4 run must be bit-identical to the reference engine's.

Scaling in n (``--n-scaling``): the cluster with each n at S=4 on ``--n-processes``
server processes, with keys, on ``--n-dataset`` (Fashion-MNIST) for ``--n-rounds`` rounds:
rounds/s, CPU per round (all processes, and per worker) and peak PSS.

Scaling in d (``--d-models``): for each model, ``--d-wire`` dtype and security mode, the
reference engine and then the cluster (S=4, n workers, ps-cluster's default P and W unless
``--d-processes`` / ``--d-worker-processes``) on synthetic data of the model's shape, for
``--d-rounds`` rounds: steady rounds/s of both and their ratio, CPU per round (user and
system apart) of both, the cluster's peak PSS, and whether they ended bit-identical.
``--layouts none`` runs only the scaling runs::

    python3 scripts/bench_cluster.py --layouts none --d-models wide --d-wire float32,bfloat16

The messaging floor (``scripts/bench_floor.py``, skipped with ``--no-floor``): for each
layout and security mode, a synthetic cluster with the same n, d, S, P, CURVE and
message pattern (n*P round trips a round) whose workers and servers only spin for the
gradient and aggregation times measured alone, with almost no Python, and the run's W
worker processes (the values sent once per worker process, bare PARAMS to its other
workers). It is what the cluster's design can reach here; the table shows the cluster
against it and the floor against the reference engine and across layouts.
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import click
import numpy as np
import torch

from common.learn.data import dataset_shape, load_dataset
from common.learn.models import build_model, num_parameters
from common.learn.rules.defence import Defence
from common.learn.rules.pre import RoundContext
from common.net.sharding import server_blocks
from common.net.wire import WIRE_DTYPES
from common.run.config import AttackConfig, RunConfig
from common.run.metrics import read_jsonl
from common.run.model_init import initial_parameters
from ps.launcher.options import local_cores
from ps.reference.engine import simulate
from worker.trainer import GradientComputer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_floor import Floor, measure_floor  # sibling scripts

SAMPLE_S = 0.2
STEADY_FROM = 10  # the steady window of the CPU figures: from this round to the last
SECURITY_MODES = ("keys", "insecure")
TICK_S = 1 / os.sysconf("SC_CLK_TCK")


@dataclass
class Reference:
    """The in-process reference engine's figures."""

    shards: int
    rounds_per_s: float
    cpu_s_per_round: float
    digest: str
    sys_s_per_round: float = 0.0  # the system (kernel) part of cpu_s_per_round
    steady_rounds_per_s: float = 0.0  # rounds/s over the same window as the CPU figures


def median_reference(runs: list[Reference]) -> Reference:
    """The reference runs' median rounds/s and CPU per round (their digest: all equal)."""
    return Reference(runs[0].shards, statistics.median(r.rounds_per_s for r in runs),
                     statistics.median(r.cpu_s_per_round for r in runs), runs[0].digest,
                     statistics.median(r.sys_s_per_round for r in runs),
                     statistics.median(r.steady_rounds_per_s for r in runs))


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
    bytes_in_per_s_per_server: float = 0.0  # per server process
    processes: int = 0
    worker_processes: int = 0  # W: the processes the n workers ran in
    security: str = "keys"
    start: str = "fork"
    workers: int = 0
    cpu_s_per_round: float | None = None  # all processes, steady window; None: too short
    sys_s_per_round: float | None = None  # the system (kernel) part of it
    steady_rounds_per_s: float | None = None  # server 0's rounds/s in the steady window
    reference: Reference | None = None  # the reference engine run just before this run
    extra: dict = field(default_factory=dict)

    def to_reference(self) -> float:
        """rounds/s / the rounds/s of the reference run beside it."""
        return self.rounds_per_s / self.reference.rounds_per_s  # type: ignore[union-attr]

    def cpu_to_reference(self) -> float | None:
        """CPU per round / the reference run's beside it (None: too short to measure)."""
        if self.cpu_s_per_round is None:
            return None
        return self.cpu_s_per_round / self.reference.cpu_s_per_round  # type: ignore[union-attr]


def median_run(repeated: list[Measured]) -> Measured:
    """One layout's repeated runs as one: the medians of its rounds/s, CPU per round, peak
    PSS and launch time, against the medians of the reference runs beside them."""
    def median(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    first = repeated[0]
    beside = median_reference([r.reference for r in repeated])  # type: ignore[misc]
    return replace(
        first, rounds_per_s=median([r.rounds_per_s for r in repeated]),
        cpu_s_per_round=median([r.cpu_s_per_round for r in repeated]),
        sys_s_per_round=median([r.sys_s_per_round for r in repeated]),
        peak_pss_mb=median([r.peak_pss_mb for r in repeated]),
        launch_to_round0_s=median([r.launch_to_round0_s for r in repeated]),
        bytes_in_per_s_per_server=median([r.bytes_in_per_s_per_server for r in repeated]),
        reference=beside, extra={**first.extra, "repeats": [asdict(r) for r in repeated]})


def pss_mb(pid: int) -> float:
    """Proportional set size of ``pid`` in MB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return 0.0


def _proc_stats() -> dict[int, tuple[int, float, float]]:
    """Every process's (parent, utime, stime) in seconds, all its threads together."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            found[int(entry.name)] = (int(fields[1]), int(fields[11]) * TICK_S,
                                      int(fields[12]) * TICK_S)
    return found


def _tree(pid: int, stats: dict[int, tuple[int, float, float]]) -> list[int]:
    """``pid`` and all its descendants (the launcher's children, forked or executed)."""
    children: dict[int, list[int]] = {}
    for p, (parent, *_) in stats.items():
        children.setdefault(parent, []).append(p)
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in stats:
            out.append(p)
        todo.extend(children.get(p, []))
    return out


class Sampler(threading.Thread):
    """Samples a process and its descendants every ``SAMPLE_S`` until stopped: the peak
    of their summed PSS, and (wall time, summed utime, summed stime) triples."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0.0
        self.cpu: list[tuple[float, float, float]] = []  # (time.time(), user s, system s)
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(SAMPLE_S):
            stats = _proc_stats()
            now = time.time()
            pids = _tree(self.pid, stats)
            self.cpu.append((now, sum(stats[p][1] for p in pids),
                             sum(stats[p][2] for p in pids)))
            self.peak = max(self.peak, sum(pss_mb(p) for p in pids))

    def cpu_per_round(self, times: list[float]) -> float | None:
        """CPU seconds (user and system) per round in the steady window (see
        :meth:`split_per_round`); None if it cannot be measured."""
        split = self.split_per_round(times)
        return None if split is None else split[0] + split[1]

    def split_per_round(self, times: list[float]) -> tuple[float, float] | None:
        """(user, system) CPU seconds per round between the first and the last sample
        inside the steady window (``times``: server-0's round timestamps; from round
        ``STEADY_FROM`` to the last), the rounds in between interpolated from them; None
        if fewer than two samples fall inside (a run too short or too fast)."""
        if len(times) < 2:
            return None
        begin, end = times[min(STEADY_FROM, len(times) - 2)], times[-1]
        inside = [sample for sample in self.cpu if begin <= sample[0] <= end]
        if len(inside) < 2:
            return None
        (t0, u0, s0), (t1, u1, s1) = inside[0], inside[-1]
        index = np.arange(len(times), dtype=float)
        rounds = float(np.interp(t1, times, index) - np.interp(t0, times, index))
        return ((u1 - u0) / rounds, (s1 - s0) / rounds) if rounds > 0 else None


def run_cluster(args: list[str], out: Path, label: str, shards: int,
                processes: int | None = None) -> Measured:
    """Start ``ps-cluster`` with ``args`` as a fresh process and measure it (``processes``:
    the ``--server-processes`` in ``args``; None: one per shard)."""
    processes = processes or shards
    argv = [sys.executable, "-m", "ps.launcher.cli", *args, "--out-dir", str(out)]
    launched = time.time()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sampler = Sampler(process.pid)
    sampler.start()
    _, stderr = process.communicate()
    sampler.stopped.set()
    sampler.join()
    if process.returncode != 0:
        raise click.ClickException(f"{label}: ps-cluster exited {process.returncode}:\n"
                                   + stderr.decode(errors="replace")[-3000:])
    summary = json.loads((out / "summary.json").read_text())
    rounds = read_jsonl(out / "server-0.jsonl")
    times = [r["time"] for r in rounds]
    span = times[-1] - times[0]
    firsts = [block[0] for block in server_blocks(shards, processes)]  # one per process
    ingested = sum(read_jsonl(out / f"server-{s}.jsonl")[-1]["bytes_in"]
                   for s in firsts) / len(firsts)
    split = sampler.split_per_round(times)
    steady = times[min(STEADY_FROM, len(times) - 2):]
    return Measured(label=label, shards=shards,
                    launch_to_round0_s=times[0] - launched,
                    startup=summary.get("startup", {}),
                    rounds_per_s=summary["rounds_per_s"], peak_pss_mb=sampler.peak,
                    wall_s=time.time() - launched, digest=summary["params_sha256"],
                    bytes_in_per_s_per_server=ingested / span if span > 0 else 0.0,
                    processes=processes,
                    cpu_s_per_round=None if split is None else split[0] + split[1],
                    sys_s_per_round=None if split is None else split[1],
                    steady_rounds_per_s=((len(steady) - 1) / (steady[-1] - steady[0])
                                         if len(steady) > 1 and steady[-1] > steady[0]
                                         else None))


def _rusage() -> tuple[float, float]:
    """This process's (user, system) CPU seconds so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def reference_engine(cfg: RunConfig, dataset: Any = None) -> Reference:
    """The in-process reference engine (one thread, as each cluster process) on ``cfg``:
    rounds/s after round 0, as the cluster's summary counts them (round 0 carries the
    kernels' warm-up: most of a second), and the rounds/s and CPU per round (user and
    system apart) from round ``STEADY_FROM`` on, as the cluster's steady window (from
    round 1 if there are not more rounds)."""
    torch.set_num_threads(1)
    attack = AttackConfig().validate(cfg)
    dataset = load_dataset(cfg.dataset, seed=cfg.seed) if dataset is None else dataset
    steady_from = STEADY_FROM if cfg.rounds > STEADY_FROM else 1
    wall: dict[int, float] = {}
    cpu: dict[int, tuple[float, float]] = {}

    def on_round(t: int, _: Any) -> None:  # t rounds done
        if t in (1, steady_from, cfg.rounds):
            wall[t], cpu[t] = time.perf_counter(), _rusage()

    result = simulate(cfg, attack, dataset=dataset, on_round=on_round)
    if cfg.rounds < 2:
        rate = cfg.rounds / result.seconds
        return Reference(cfg.num_shards, rate, sum(cpu[1]), result.digest, cpu[1][1], rate)
    steady = cfg.rounds - steady_from
    user = (cpu[cfg.rounds][0] - cpu[steady_from][0]) / steady
    system = (cpu[cfg.rounds][1] - cpu[steady_from][1]) / steady
    return Reference(cfg.num_shards, (cfg.rounds - 1) / (wall[cfg.rounds] - wall[1]),
                     user + system, result.digest, system,
                     steady / (wall[cfg.rounds] - wall[steady_from]))

@dataclass
class DRun:
    """One model's cluster run at S = 4 and the reference engine run just before it."""

    model: str
    d: int
    dataset: str
    wire: str
    security: str
    rounds: int
    cluster: Measured
    engine: Reference

    @property
    def ratio(self) -> float | None:
        """Steady rounds/s of the cluster / of the engine beside it (the same rounds)."""
        rate = self.cluster.steady_rounds_per_s
        return None if rate is None else rate / self.engine.steady_rounds_per_s

    @property
    def identical(self) -> bool:
        return self.cluster.digest == self.engine.digest


@dataclass
class NScaling:
    """One n's run at S = 4 (keys)."""

    workers: int
    shards: int
    processes: int
    rounds: int
    rounds_per_s: float
    cpu_s_per_round: float | None
    peak_pss_mb: float
    launch_to_round0_s: float

    @property
    def cpu_ms_per_round_per_worker(self) -> float | None:
        return (None if self.cpu_s_per_round is None
                else self.cpu_s_per_round / self.workers * 1e3)


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


def d_dataset(model: str, given: str) -> str:
    """The dataset of a ``--d-models`` run: ``given``, or the synthetic data of the shape
    the model is built for (CIFAR-10's for resnet18)."""
    return given or ("synthetic-cifar" if model == "resnet18" else "synthetic")


def d_run(model: str, dataset: str, wire: str, mode: str, cfg: RunConfig, out: Path,
          processes: int | None, worker_processes: int | None) -> DRun:
    """The reference engine on ``cfg``, then the cluster with the same settings (S = 4,
    ps-cluster's default P and W unless given), with keys or without (``mode``)."""
    click.echo(f"running d: {model} on {dataset}, {wire} on the wire, {mode}: the "
               f"reference engine, then the cluster ...", err=True)
    engine = reference_engine(cfg)
    args = ["--workers", str(cfg.num_workers), "--shards", str(cfg.num_shards), "--rule",
            cfg.rule, "--model", model, "--dataset", dataset, "--rounds", str(cfg.rounds),
            "--wire-dtype", wire, "--no-evaluator",
            *(["--server-processes", str(processes)] if processes else []),
            *(["--worker-processes", str(worker_processes)] if worker_processes else []),
            *(["--insecure"] if mode == "insecure" else [])]
    blocks = processes or min(cfg.num_shards, local_cores())
    cluster = run_cluster(args, out, f"d: {model} {wire} {mode}", cfg.num_shards, blocks)
    return DRun(model, num_parameters(build_model(model, *dataset_shape(dataset), 0)),
                dataset, wire, mode, cfg.rounds, cluster, engine)


def _print_d_table(rows: list[DRun], workers: int, rule: str) -> None:
    click.echo(f"\nscaling in d: n={workers}, S=4, {rule}, ps-cluster's default P and W "
               f"unless given; rounds/s and CPU per round in the steady window (from round "
               f"{STEADY_FROM} to the last), the reference engine (one process, one thread) "
               "run just before each cluster run")
    click.echo("| model | d | wire | security | engine rounds/s | cluster rounds/s | cluster / "
               "engine | CPU-s per round, cluster: user / system | engine: user / system | "
               "peak PSS, cluster | bit-identical |")
    click.echo("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        c, e = r.cluster, r.engine
        user = None if c.cpu_s_per_round is None else c.cpu_s_per_round - c.sys_s_per_round
        click.echo(f"| {r.model} | {r.d:,} | {r.wire} | {r.security} | "
                   f"{e.steady_rounds_per_s:.3f} | "
                   f"{'-' if c.steady_rounds_per_s is None else f'{c.steady_rounds_per_s:.3f}'}"
                   f" | {'-' if r.ratio is None else f'{r.ratio:.2f}'} | {_cpu(user)} / "
                   f"{_cpu(c.sys_s_per_round)} | {e.cpu_s_per_round - e.sys_s_per_round:.3f} "
                   f"/ {e.sys_s_per_round:.3f} | {c.peak_pss_mb / 1024:.2f} GB | "
                   f"{r.identical} |")


def _print_n_table(rows: list[NScaling], model: str, rule: str, dataset: str,
                   worker_processes: int) -> None:
    click.echo(f"\nscaling in n (S={rows[0].shards} on P={rows[0].processes} server "
               f"processes, the n workers in W={worker_processes} processes, keys, {dataset}, "
               f"{model}, {rule}, {rows[0].rounds} rounds; CPU of all processes in the steady "
               f"window)")
    click.echo("| n | launch to end of round 0 | steady rounds/s | CPU-s per round | "
               "CPU-ms per round per worker | peak PSS, all processes |")
    click.echo("|---|---|---|---|---|---|")
    for r in rows:
        per_worker = r.cpu_ms_per_round_per_worker
        click.echo(f"| {r.workers} | {r.launch_to_round0_s:.2f} s | {r.rounds_per_s:.1f} | "
                   f"{_cpu(r.cpu_s_per_round)} | "
                   f"{'-' if per_worker is None else f'{per_worker:.1f}'} | "
                   f"{r.peak_pss_mb / 1024:.2f} GB |")


def _cpu(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.3f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}"


def parse_layouts(layouts: str, shards: str | None) -> list[tuple[int, int]]:
    """(S, P) pairs: ``--shards`` (S:S each) if given, else ``--layouts`` (``S:P``; a
    bare ``S`` is ``S:S``)."""
    if shards:
        return [(int(s), int(s)) for s in shards.split(",")]
    out = []
    for entry in filter(None, (e.strip() for e in layouts.split(","))):
        s, _, p = entry.partition(":")
        try:
            pair = (int(s), int(p or s))
        except ValueError:
            raise click.BadParameter(f"{entry!r} is not S:P", param_hint="--layouts") from None
        if not 1 <= pair[1] <= pair[0]:
            raise click.BadParameter(f"{entry}: P must be in 1..S", param_hint="--layouts")
        out.append(pair)
    if not out:
        raise click.BadParameter("no layout", param_hint="--layouts")
    return out


@click.command(context_settings={"show_default": True})
@click.option("--workers", default=20, type=int)
@click.option("--layouts", default="4:1,4:2,4:4,20:4,20:20", help="Layouts S:P to run (S "
              "shards on P server processes), comma-separated; none: only the scaling "
              "runs (--d-models, --n-scaling).")
@click.option("--shards", default=None, help="Shorthand for --layouts with one process per "
              "shard: 4,20 is 4:4,20:20 (overrides --layouts).")
@click.option("--rule", default="marmed")
@click.option("--model", default="mlp")
@click.option("--dataset", default="fashion-mnist")
@click.option("--rounds", default=300, type=int)
@click.option("--start", default="fork", help="Start methods to compare: fork, exec or both "
              "(fork,exec).")
@click.option("--security", default="keys,insecure", help="Run every layout with CURVE keys "
              "(keys, as ps-cluster runs by default), without (insecure) or both, in that "
              "order.")
@click.option("--insecure", is_flag=True, help="Shorthand for --security insecure.")
@click.option("--worker-processes", "worker_processes", default="", help="Run every layout "
              "with each of these numbers W of worker processes, comma-separated (n: one "
              "per worker). Default: ps-cluster's default, min(n, 2 x cores).")
@click.option("--repeats", default=1, type=click.IntRange(min=1), help="Run every layout "
              "this many times (all layouts in turn, then again), each after its own "
              "reference run; the tables give each layout's medians.")
@click.option("--no-floor", is_flag=True, help="Skip the messaging floor (a quick check).")
@click.option("--floor-rounds", default=200, type=int, help="Timed rounds of each messaging "
              "floor (after 20 of warm-up).")
@click.option("--d-models", default="", help="Also measure scaling in d at S=4 with these "
              "models, comma-separated (mlp, cnn, wide: 10.6M parameters, resnet18: 11.2M), "
              "each against the reference engine run just before it, for each --security "
              "mode and --d-wire dtype.")
@click.option("--d-rounds", default=24, type=int, help="Rounds of each --d-models run (the "
              "steady window starts at round 10).")
@click.option("--d-processes", default=None, type=int, help="Server processes P of the "
              "--d-models runs (S=4; default ps-cluster's).")
@click.option("--d-worker-processes", default=None, type=int, help="Worker processes W of "
              "the --d-models runs (default ps-cluster's).")
@click.option("--d-dataset", "d_dataset_given", default="", help="Dataset of the --d-models "
              "runs (default: synthetic data of the model's shape: synthetic-cifar for "
              "resnet18, else synthetic).")
@click.option("--d-wire", default="float32", help="--wire-dtype values of the --d-models "
              "runs, comma-separated (float32, bfloat16).")
@click.option("--n-scaling", default="", help="Also measure scaling in n at S=4 with keys on "
              "--n-dataset: numbers of workers, comma-separated (e.g. 20,50,100).")
@click.option("--n-dataset", default="fashion-mnist", help="Dataset of the --n-scaling runs "
              "(synthetic's 2,100 samples leave 100 workers less than a batch each).")
@click.option("--n-rounds", default=100, type=int, help="Rounds of each --n-scaling run.")
@click.option("--n-processes", default=4, type=int, help="Server processes P of the "
              "--n-scaling runs (S=4).")
@click.option("--json", "json_path", default=None, type=click.Path(path_type=Path))
def main(workers: int, layouts: str, shards: str | None, rule: str, model: str, dataset: str,
         rounds: int, start: str, security: str, insecure: bool, worker_processes: str,
         repeats: int, no_floor: bool, floor_rounds: int, d_models: str, d_rounds: int,
         d_processes: int | None, d_worker_processes: int | None, d_dataset_given: str,
         d_wire: str, n_scaling: str, n_rounds: int, n_dataset: str, n_processes: int,
         json_path: Path | None) -> None:
    pairs = [] if layouts == "none" and not shards else parse_layouts(layouts, shards)
    modes = ["insecure"] if insecure else [m.strip() for m in security.split(",") if m.strip()]
    if not modes or any(m not in SECURITY_MODES for m in modes):
        raise click.BadParameter(f"{security!r}: keys, insecure or both",
                                 param_hint="--security")
    for p in (d_processes or 1, n_processes):
        if not 1 <= p <= 4:
            raise click.BadParameter(f"{p} server processes for S=4: must be in 1..4")
    wires = [w.strip() for w in d_wire.split(",") if w.strip()]
    if not wires or any(w not in WIRE_DTYPES for w in wires):
        raise click.BadParameter(f"{d_wire!r}: {' or '.join(WIRE_DTYPES)}",
                                 param_hint="--d-wire")
    teams = [int(w) for w in filter(None, worker_processes.split(","))] or [
        min(workers, 2 * local_cores())]
    if any(not 1 <= w <= workers for w in teams):
        raise click.BadParameter(f"{worker_processes}: each W must be in 1..n={workers}")
    report: dict[str, Any] = {}
    if pairs:
        report |= compare_layouts(pairs, modes, teams, workers, rule, model, dataset, rounds,
                                  start, repeats, no_floor, floor_rounds)
    n_rows = []
    for n in (int(x) for x in filter(None, n_scaling.split(","))):
        args = ["--workers", str(n), "--shards", "4", "--server-processes", str(n_processes),
                "--worker-processes", str(min(n, teams[0])), "--rule", rule, "--model", model,
                "--dataset", n_dataset, "--rounds", str(n_rounds), "--no-evaluator",
                "--start", start.split(",")[0]]
        with tempfile.TemporaryDirectory() as tmp:
            click.echo(f"running n={n} ...", err=True)
            run = run_cluster(args, Path(tmp) / "run", f"n={n}", 4, n_processes)
        n_rows.append(NScaling(n, 4, n_processes, n_rounds, run.rounds_per_s,
                               run.cpu_s_per_round, run.peak_pss_mb, run.launch_to_round0_s))
    if n_rows:
        _print_n_table(n_rows, model, rule, n_dataset, teams[0])
        report["n_scaling"] = [{**asdict(r), "cpu_ms_per_round_per_worker":
                                r.cpu_ms_per_round_per_worker} for r in n_rows]
    scaling = []
    for name, wire, mode in itertools.product(filter(None, d_models.split(",")), wires, modes):
        data_name = d_dataset(name, d_dataset_given)
        d_cfg = RunConfig(dataset=data_name, model=name, num_workers=workers, num_shards=4,
                          rule=rule, rounds=d_rounds, wire_dtype=wire).validate()
        with tempfile.TemporaryDirectory() as tmp:
            scaling.append(d_run(name, data_name, wire, mode, d_cfg, Path(tmp) / "run",
                                 d_processes, d_worker_processes))
    if scaling:
        _print_d_table(scaling, workers, rule)
        report["d_scaling"] = [{**asdict(r), "cluster_over_engine": r.ratio,
                                "bit_identical": r.identical} for r in scaling]
    if json_path:
        json_path.write_text(json.dumps(report, indent=2))


def compare_layouts(pairs: list[tuple[int, int]], modes: list[str], teams: list[int],
                    workers: int, rule: str, model: str, dataset: str, rounds: int,
                    start: str, repeats: int, no_floor: bool,
                    floor_rounds: int) -> dict[str, Any]:
    """Every layout S:P (each W, start method and security mode, ``repeats`` times), each
    after its own reference engine run; the tables, the identity check, the targets and
    the messaging floors; what ``--json`` writes of them."""
    ref_shards = 4 if any(s == 4 for s, _ in pairs) else pairs[0][0]
    cfg = RunConfig(dataset=dataset, model=model, num_workers=workers, num_shards=ref_shards,
                    rule=rule, rounds=rounds).validate()
    ref_data = load_dataset(cfg.dataset, seed=cfg.seed)
    references: list[Reference] = []
    every: list[Measured] = []  # each repeat's runs, all layouts in turn
    for repeat, method, mode, (s, p), w in itertools.product(
            range(repeats), start.split(","), modes, pairs, teams):
        args = ["--workers", str(workers), "--shards", str(s),
                "--server-processes", str(p), "--worker-processes", str(w),
                "--rule", rule, "--model", model, "--dataset", dataset,
                "--rounds", str(rounds), "--no-evaluator", "--start", method,
                *(["--insecure"] if mode == "insecure" else [])]
        label = f"S={s} P={p} W={w} {method} {mode}"
        click.echo(f"running the reference engine, then {label} (repeat "
                   f"{repeat + 1} of {repeats}) ...", err=True)
        references.append(reference_engine(cfg, ref_data))
        with tempfile.TemporaryDirectory() as tmp:
            run = run_cluster(args, Path(tmp) / "run", label, s, p)
        every.append(replace(run, security=mode, start=method, workers=workers,
                             worker_processes=w, reference=references[-1]))
    if len({r.digest for r in references}) != 1:
        raise click.ClickException("the reference engine's runs ended with different "
                                   "parameters: it is not deterministic")
    reference = median_reference(references)
    runs = [median_run([r for r in every if r.label == label])
            for label in dict.fromkeys(r.label for r in every)]
    _print_table(runs, reference, references)
    _print_identity(every, reference)
    targets = _print_targets(runs, reference)
    floors: list[tuple[Measured, Floor]] = []
    if not no_floor:
        floors = messaging_floors(runs, cfg, floor_rounds)
        _print_floor_table(floors, reference)
    return {"reference": asdict(reference),  # the median of the runs
            "reference_rounds_per_s": reference.rounds_per_s,
            "reference_runs": [asdict(r) for r in references],
            "runs": [asdict(r) for r in runs],
            "targets": targets,
            "floors": [{"run": r.label, **asdict(f)} for r, f in floors]}


def messaging_floors(runs: list[Measured], cfg: RunConfig,
                     rounds: int) -> list[tuple[Measured, Floor]]:
    """The messaging floor of each run's layout and security mode, with this model's
    gradient and each S's aggregation as measured alone (each measured once)."""
    data = load_dataset(cfg.dataset, seed=cfg.seed)
    d = num_parameters(build_model(cfg.model, tuple(data.train_x.shape[1:]),
                                   data.num_classes, 0))
    compute_ms = isolated_costs(cfg, data, reps=50)[0]  # the same at every S
    aggregation: dict[int, float] = {}
    floors: dict[tuple[int, int, int, bool], Floor] = {}
    out = []
    for r in runs:
        curve = r.security == "keys"
        key = (r.shards, r.processes, r.worker_processes, curve)
        if key not in floors:
            click.echo(f"measuring the messaging floor at S={r.shards} P={r.processes} "
                       f"W={r.worker_processes} {r.security} ...", err=True)
            if r.shards not in aggregation:
                aggregation[r.shards] = isolated_costs(replace(cfg, num_shards=r.shards), data,
                                                       reps=50)[1]
            floors[key] = measure_floor(cfg.num_workers, r.shards, d, curve, compute_ms,
                                        aggregation[r.shards], rounds,
                                        processes=r.processes,
                                        worker_processes=r.worker_processes)
        out.append((r, floors[key]))
    return out


def _print_floor_table(floors: list[tuple[Measured, Floor]], reference: Reference) -> None:
    click.echo("\nthe messaging floor (scripts/bench_floor.py): the same n, d, S, P, CURVE "
               "and message pattern (n*P round trips a round), workers and servers only "
               "spinning for the gradient and each shard's aggregation measured alone")
    click.echo("| run | rounds/s | floor rounds/s | / floor | floor / median reference | CPU per "
               "round: cluster / floor | gradient / aggregation alone |")
    click.echo("|---|---|---|---|---|---|---|")
    for r, f in floors:
        cluster_cpu = "-" if r.cpu_s_per_round is None else f"{r.cpu_s_per_round * 1e3:.0f}"
        click.echo(f"| {r.label} | {r.rounds_per_s:.1f} | {f.rounds_per_s:.1f} | "
                   f"{r.rounds_per_s / f.rounds_per_s:.2f} | "
                   f"{f.rounds_per_s / reference.rounds_per_s:.2f} | "
                   f"{cluster_cpu} / {f.cpu_ms_per_round:.0f} ms | "
                   f"{f.compute_ms:.2f} / {f.aggregate_ms:.2f} ms |")
    seen: dict[tuple[int, int, bool], Floor] = {}  # the fastest over W
    for _, f in floors:
        key = (f.shards, f.processes, f.curve)
        if key not in seen or f.rounds_per_s > seen[key].rounds_per_s:
            seen[key] = f
    for curve in (True, False):
        base = seen.get((4, 4, curve))
        if base is None:
            continue
        mode = "keys" if curve else "insecure"
        for other in ((20, 4), (20, 20)):
            if (*other, curve) in seen:
                click.echo(f"floor {mode}: S={other[0]} on {other[1]} / S=4 on 4 = "
                           f"{seen[(*other, curve)].rounds_per_s / base.rounds_per_s:.2f}")


def _pick(runs: list[Measured], mode: str, shards: int, processes: int) -> Measured | None:
    """The fastest run of this layout and security mode (over the worker processes W)."""
    return max((r for r in runs if r.security == mode and r.shards == shards
                and r.processes == processes), key=lambda r: r.rounds_per_s, default=None)


def _print_targets(runs: list[Measured], reference: Reference) -> dict:
    """The issue's targets, as ratios of this run's figures (returned for --json)."""
    targets: dict[str, Any] = {}
    lines = []
    for mode in SECURITY_MODES:
        mine = [r for r in runs if r.security == mode and r.start == runs[0].start]
        if not mine:
            continue
        s4 = _pick(mine, mode, 4, 4)
        for s, p, goal in ((20, 4, " (target >= 0.9)"), (20, 20, " (for comparison)")):
            other = _pick(mine, mode, s, p)
            if s4 and other:
                ratio = other.rounds_per_s / s4.rounds_per_s
                targets[f"{mode}: S={s} P={p} / S=4 P=4"] = ratio
                lines.append(f"{mode}: rounds/s at S={s} on {p} processes / S=4 on 4 = "
                             f"{ratio:.2f}{goal}")
        at4 = [r for r in mine if r.shards == 4]
        if at4 and reference.shards == 4:
            best = max(at4, key=lambda r: r.rounds_per_s)
            goal = 0.6 if mode == "keys" else 0.9
            ratio = best.to_reference()
            median = best.rounds_per_s / reference.rounds_per_s
            targets[f"{mode}: S=4 best P / reference"] = ratio
            targets[f"{mode}: S=4 best P / median reference"] = median
            targets[f"{mode}: S=4 best P"] = best.processes
            targets[f"{mode}: S=4 best W"] = best.worker_processes
            lines.append(f"{mode}: rounds/s at S=4 (best P={best.processes}, "
                         f"W={best.worker_processes}) / reference engine beside it = "
                         f"{best.rounds_per_s:.1f} / {best.reference.rounds_per_s:.1f} = "  # type: ignore[union-attr]
                         f"{ratio:.2f} (target >= {goal}; / the median reference: "
                         f"{median:.2f})")
            cpu = best.cpu_to_reference()
            if cpu is not None:
                targets[f"{mode}: S=4 best P CPU per round / reference"] = cpu
                lines.append(f"{mode}: CPU per round at S=4 (P={best.processes}, "
                             f"W={best.worker_processes}) / reference engine beside it = "
                             f"{best.cpu_s_per_round:.3f} / "
                             f"{best.reference.cpu_s_per_round:.3f} s = {cpu:.2f}")  # type: ignore[union-attr]
    if lines:
        click.echo("\nthe targets, as ratios of this run (" + runs[0].start + "):")
        for line in lines:
            click.echo(f"* {line}")
    return targets


def _print_table(runs: list[Measured], reference: Reference,
                 references: list[Reference]) -> None:
    click.echo("")
    repeats = len(references) // len(runs)
    if repeats > 1:
        click.echo(f"(each run: the medians of {repeats} runs, and of the reference runs "
                   "beside them)")
    click.echo("| run | launch to end of round 0 | imports / kernels / dataset in the "
               "launcher | servers ready / all started | steady rounds/s | / reference "
               "beside it | CPU-s per round, all processes | of it system | / reference "
               "beside it | peak PSS, all processes | MB/s in per server process |")
    click.echo("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        prep = r.startup.get("prepare", {})
        prepared = (f"{prep.get('imports_s', 0):.2f} / {prep.get('kernels_s', 0):.2f} / "
                    f"{prep.get('dataset_s', 0):.2f} s" if prep else "- (each child)")
        click.echo(f"| {r.label} | {r.launch_to_round0_s:.2f} s | {prepared} | "
                   f"{r.startup.get('servers_ready_s', 0):.2f} / "
                   f"{r.startup.get('all_started_s', 0):.2f} s | {r.rounds_per_s:.1f} | "
                   f"{r.to_reference():.2f} | {_cpu(r.cpu_s_per_round)} | "
                   f"{_cpu(r.sys_s_per_round)} | "
                   f"{_ratio(r.cpu_s_per_round, r.reference.cpu_s_per_round)} | "  # type: ignore[union-attr]
                   f"{r.peak_pss_mb / 1024:.2f} GB | "
                   f"{r.bytes_in_per_s_per_server / 1e6:.0f} |")
    low = min(b.rounds_per_s for b in references)
    high = max(b.rounds_per_s for b in references)
    click.echo(f"| reference engine (1 process, 1 thread, S={reference.shards}): the median "
               f"of {len(references)} runs, one just before each cluster run ({low:.1f} to "
               f"{high:.1f} rounds/s) | - | - | - | {reference.rounds_per_s:.1f} | 1.00 | "
               f"{reference.cpu_s_per_round:.3f} | {reference.sys_s_per_round:.3f} | 1.00 | "
               "- | - |")
    if any(r.cpu_s_per_round is None for r in runs):
        click.echo(f"(CPU -: fewer than two samples, every {SAMPLE_S:g} s, fell between round "
                   f"{STEADY_FROM} and the last: run more rounds)")


def _print_identity(runs: list[Measured], reference: Reference) -> None:
    same = [r for r in runs if r.shards == reference.shards]
    if not same:
        return
    differing = [r.label for r in same if r.digest != reference.digest]
    click.echo(f"final parameters of the {len(same)} S={reference.shards} run(s) "
               f"bit-identical to the reference engine: {not differing}"
               + (f" (not: {', '.join(differing)})" if differing else ""))


if __name__ == "__main__":
    main()
