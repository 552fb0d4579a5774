"""Running the cells of a grid: each through the in-process reference engine (whose
final parameters are bit-identical to a cluster's), one cell per process; or each through
real processes (``--engine cluster``), one cluster at a time. Cached either way.

A finished cell is a JSON file ``cells/<key>.json`` (``cells/cluster-<key>.json``) in
the output directory, written atomically when the cell ends; a grid run again (after an
interruption, or with more seeds) computes only the cells that have none. The runs of a
published results folder (``--cached-from docs/results/paper``: its ``results.jsonl.gz``,
in git) fill the cache too, so a grid grown by seeds or sweeps resumes from it in a fresh
clone.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from common.run import plugins
from common.run.process import ProcessOptions, check_stop
from ps.experiments.grid import Cell

CELLS_DIR = "cells"
CLUSTER_DIR = "cluster"  # the run directories of cells run through the cluster
STOP_POLL_S = 0.5  # how soon a stop request (SIGTERM, Ctrl-C) ends the cells running


_datasets: dict[tuple[str, Path | None, int, float], Any] = {}


def run_cell(cell: Cell, data_dir: Path | None, eval_every: int,
             eval_samples: int | None) -> dict[str, Any]:
    """Train ``cell`` with the reference engine; its evaluation points and final hash."""
    import torch

    from common.learn.data import run_dataset
    from common.run.model_init import initial_parameters
    from ps.reference.engine import simulate
    from worker.evaluator import Evaluator

    torch.set_num_threads(1)  # one cell per core; and as the cluster's workers compute
    plugins.load_plugins({**cell.run, **cell.attack})  # (a fresh process: its plugins)
    cfg, attack = cell.configs()
    key = (cfg.dataset, data_dir, cfg.seed, cfg.validation)
    if key not in _datasets:
        _datasets[key] = run_dataset(cfg, data_dir)
    evaluator = Evaluator(cfg, _datasets[key], eval_samples)
    points = []

    def record(t: int, params) -> None:
        e = evaluator.evaluate(params)
        points.append({"round": t, "top1": e.top1, "top3": e.top3, "loss": e.loss})

    record(0, initial_parameters(cfg))
    result = simulate(cfg, attack, dataset=_datasets[key], settle_broken=True,
                      on_round=lambda t, sim: (record(t, sim.params())
                                               if t % eval_every == 0 or t == cfg.rounds
                                               else None))
    return {"key": cell.key, "figure": cell.figure, "scenario": cell.scenario,
            "rule": cell.rule, "defence": cell.defence, "q": cfg.q,
            "worker_momentum": cfg.worker_momentum, "batch_size": cfg.batch_size,
            "seed": cfg.seed, "rounds": cfg.rounds, "dataset": cfg.dataset,
            "seconds": result.seconds, "machine": machine(),
            "params_sha256": result.digest, "points": points}


def machine() -> str:
    """What a run's floating-point rounding depends on besides the code: the CPU (its
    model name, family/model/stepping and a digest of its feature flags: hosts sold under
    one name differ in the vector units the libraries pick) and the numeric libraries
    (torch with the CPU capability it dispatches to). The same cell run where this
    differs may end with other bits (the same experiment, rounded otherwise), so only
    runs of one machine are compared bit for bit."""
    import platform

    import numpy
    import torch

    fields = {"model name": platform.processor() or platform.machine()}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                key, _, value = line.partition(":")
                if not key.strip():
                    break  # the first processor's block is enough
                fields.setdefault(key.strip(), value.strip())
                if key.strip() == "model name":
                    fields["model name"] = value.strip()
    except OSError:
        pass
    cpu = fields["model name"]
    if "cpu family" in fields:
        cpu += (f" (family {fields['cpu family']} model {fields.get('model', '?')}"
                f" stepping {fields.get('stepping', '?')})")
    if "flags" in fields:
        flags = " ".join(sorted(fields["flags"].split()))
        cpu += f" flags {hashlib.sha256(flags.encode()).hexdigest()[:8]}"
    capability = torch.backends.cpu.get_cpu_capability()
    return f"{cpu}; torch {torch.__version__} {capability}; numpy {numpy.__version__}"


def run_cluster_cell(cell: Cell, out: Path, data_dir: Path | None, eval_every: int,
                     eval_samples: int | None) -> dict[str, Any]:
    """Train ``cell`` through real ``ps-server``/``ps-worker``/``ps-proxy`` processes (in
    ``OUT/cluster/<key>``); the same record as :func:`run_cell`."""
    from ps.launcher.cluster import Cluster, ClusterSpec
    from ps.launcher.options import ClusterOptions
    from server.deadline import NONE
    from server.options import ServerOptions
    from worker.options import ClientOptions, EvalOptions

    cfg, attack = cell.configs()
    run_dir = out / CLUSTER_DIR / cell.key
    if run_dir.exists():  # an interrupted run of this cell: start it afresh
        shutil.rmtree(run_dir)
    # the paper's strictly synchronous SGD: every round waits for all n workers (a cell
    # is a claim about the rule, not about who was slow), and a lost worker fails it
    spec = ClusterSpec(cfg=cfg, attack=attack, out_dir=run_dir,
                       client=ClientOptions(data_dir=data_dir),
                       evaluation=EvalOptions(eval_every=eval_every, eval_samples=eval_samples),
                       cluster=ClusterOptions(max_restarts=0),
                       server=ServerOptions(round_timeout=NONE),
                       process=ProcessOptions(out_dir=run_dir, torch_threads=1))
    result = Cluster(spec).run()
    points = [{k: e[k] for k in ("round", "top1", "top3", "loss")} for e in result.evaluations]
    return {"key": cell.key, "engine": "cluster", "figure": cell.figure,
            "scenario": cell.scenario, "rule": cell.rule, "defence": cell.defence, "q": cfg.q,
            "worker_momentum": cfg.worker_momentum, "batch_size": cfg.batch_size,
            "seed": cfg.seed, "rounds": cfg.rounds,
            "dataset": cfg.dataset, "seconds": result.seconds,
            "params_sha256": result.digest, "points": points}


@dataclass(frozen=True)
class CellRun:
    """How to run cells: the engine and what every cell shares."""

    out: Path
    data_dir: Path | None
    eval_every: int
    eval_samples: int | None
    engine: str = "reference"  # or "cluster"
    jobs: int = 2  # cells at once (reference engine; a cluster uses every core itself)
    cached_from: tuple[Path, ...] = ()  # results folders whose runs fill the cache
    cached_only: bool = False  # report the cells already run; run none


def cell_path(out: Path, cell: Cell, engine: str = "reference") -> Path:
    prefix = "" if engine == "reference" else f"{engine}-"
    return out / CELLS_DIR / f"{prefix}{cell.key}.json"


def load_cell(out: Path, cell: Cell, engine: str = "reference") -> dict[str, Any] | None:
    """The cached result of ``cell`` on ``engine``, or None if it has not finished."""
    try:
        return json.loads(cell_path(out, cell, engine).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def run_cells(cells: Iterable[Cell], how: CellRun,
              progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
              ) -> list[dict[str, Any]]:
    """Every cell's result: cached ones read, the others computed (and cached)."""
    cells = list(cells)
    for directory in how.cached_from:
        taken = fill_cache(how.out, directory, cells, how.engine)
        progress(f"{directory}: {taken} runs of this grid taken into {how.out / CELLS_DIR}")
    results: dict[str, dict[str, Any]] = {}
    todo: dict[str, Cell] = {}  # by key: a cell of two figures runs once
    for cell in cells:
        cached = load_cell(how.out, cell, how.engine)
        if cached is not None:
            results[cell.key] = cached
        else:
            todo.setdefault(cell.key, cell)
    distinct = len({c.key for c in cells})
    if how.cached_only:
        progress(f"{len(cells)} cells ({distinct} distinct runs): {distinct - len(todo)} "
                 f"cached, {len(todo)} not yet run (--cached-only: left out)")
        return [{**results[c.key], **c.tags()} for c in cells if c.key in results]
    at_once = how.jobs if how.engine == "reference" else 1
    progress(f"{len(cells)} cells ({distinct} distinct runs): {distinct - len(todo)} cached, "
             f"{len(todo)} to run ({at_once} at a time, {how.engine} engine)")
    (how.out / CELLS_DIR).mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    for done, (cell, result) in enumerate(_computed(list(todo.values()), how), start=1):
        _write_atomically(cell_path(how.out, cell, how.engine), result)
        results[cell.key] = result
        elapsed = time.monotonic() - started
        eta = elapsed / done * (len(todo) - done)
        progress(f"{_bar(done, len(todo))} {done}/{len(todo)} | elapsed {elapsed:.0f} s, "
                 f"ETA {eta:.0f} s | {cell.label()}: top-1 "
                 f"{result['points'][-1]['top1']:.3f} ({result['seconds']:.0f} s)")
    _write_events(how.out, cells, results)
    return [{**results[c.key], **c.tags()} for c in cells]


# what a results line holds beside a run's own record (``Cell.tags``: the figure may be
# another one that shares the run)
TAG_KEYS = ("figure", "num_workers", "num_byzantine", "num_shards", "validation")


def fill_cache(out: Path, directory: Path, cells: Sequence[Cell],
               engine: str = "reference") -> int:
    """Write the runs in ``directory``'s results (``ps.experiments.rebuild.read_results``)
    that are cells of ``cells`` on ``engine`` into ``out``'s cache, unless cached there
    already; how many. ``ConfigError`` if ``directory`` holds no results."""
    from ps.experiments.rebuild import read_results

    wanted = {c.key: c for c in cells}
    (out / CELLS_DIR).mkdir(parents=True, exist_ok=True)
    taken = 0
    for record in read_results(directory):
        cell = wanted.get(record.get("key", ""))
        if cell is None or record.get("engine", "reference") != engine \
                or load_cell(out, cell, engine) is not None:
            continue
        run = {k: v for k, v in record.items() if k not in TAG_KEYS}
        _write_atomically(cell_path(out, cell, engine), {**run, "figure": cell.figure})
        taken += 1
    return taken


def _write_events(out: Path, cells: list[Cell], results: dict[str, dict[str, Any]]) -> None:
    """With TensorBoard installed, each cell's evaluation points in
    ``out/tensorboard/<cell label>/`` (once per cell; the grid's runs side by side)."""
    from ps.plots.tensorboard import EVENTS_DIR, available, write_points

    if not available():
        return
    for cell in {c.key: c for c in cells}.values():
        logdir = out / EVENTS_DIR / cell.label().replace(" ", "_")
        if not logdir.exists():
            write_points(logdir, results[cell.key]["points"])


def _bar(done: int, total: int, width: int = 24) -> str:
    filled = round(width * done / total) if total else width
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _computed(todo: list[Cell], how: CellRun) -> Iterator[tuple[Cell, dict[str, Any]]]:
    """(cell, result) as each finishes: a pool of reference-engine processes, or one
    cluster after another. A stop request (SIGTERM, Ctrl-C) ends the pool's processes
    within ``STOP_POLL_S`` (``Interrupted``), and a cell process that dies (the OOM
    killer) ends the grid (``BrokenProcessPool``): none is left computing."""
    args = (how.data_dir, how.eval_every, how.eval_samples)
    if how.engine == "cluster":
        for cell in todo:
            check_stop()
            yield cell, run_cluster_cell(cell, how.out, *args)
        return
    pool = ProcessPoolExecutor(max_workers=how.jobs, mp_context=get_context("spawn"),
                               initializer=_start_cell_process,
                               initargs=(dict(plugins.LOADED),))
    try:
        running = {pool.submit(run_cell, c, *args): c for c in todo}
        while running:
            finished, _ = wait(running, timeout=STOP_POLL_S, return_when=FIRST_COMPLETED)
            check_stop()
            for future in finished:
                yield running.pop(future), future.result()
    except BaseException:  # a stop, a failed cell, or the caller gone: end the others
        _terminate(pool)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _terminate(pool: ProcessPoolExecutor) -> None:
    """End ``pool``'s processes now, their cells unfinished (Python 3.14 has
    ``terminate_workers``; before it, the processes are reached directly)."""
    terminate = getattr(pool, "terminate_workers", None)
    if terminate is not None:
        terminate()
        return
    for process in list((pool._processes or {}).values()):
        process.terminate()


def _start_cell_process(loaded: dict[str, str]) -> None:
    """(In a pool process.) Leave Ctrl-C to the parent, which stops the pool; load the
    plugins the parent had (a grid's cells all hold the settings of every one)."""
    plugins.load_again(loaded)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def verify_sample(cells: Sequence[Cell], results: list[dict[str, Any]], count: int,
                  how: CellRun, progress: Callable[[str], None] = lambda line: print(
                      line, file=sys.stderr)) -> list[dict[str, Any]]:
    """Run ``count`` randomly chosen cells through the cluster as well; for each, the
    two final parameter hashes and whether they are the same. Only cells run on this
    machine are chosen (:func:`machine`: another CPU or library rounds otherwise)."""
    by_key = {r["key"]: r for r in results}
    here = machine()
    distinct = [c for c in {c.key: c for c in cells}.values()
                if by_key[c.key].get("machine") == here]
    chosen = random.SystemRandom().sample(distinct, min(count, len(distinct)))
    if not chosen:
        progress("verifying through the cluster: no cell was run on this machine")
        return []
    progress("verifying through the cluster: " + ", ".join(c.label() for c in chosen))
    cluster = run_cells(chosen, replace(how, engine="cluster"), progress)
    return [{"label": c.label(), "key": c.key, "reference": by_key[c.key]["params_sha256"],
             "cluster": r["params_sha256"],
             "same": by_key[c.key]["params_sha256"] == r["params_sha256"]}
            for c, r in zip(chosen, cluster, strict=True)]


def _write_atomically(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record) + "\n", encoding="utf-8")
    os.replace(tmp, path)
