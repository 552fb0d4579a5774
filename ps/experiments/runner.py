"""Running the cells of a grid: each through the in-process reference engine (whose
final parameters are bit-identical to a cluster's), one cell per process, cached.

A finished cell is a JSON file ``cells/<key>.json`` in the output directory, written
atomically when the cell ends; a grid run again (after an interruption, or with more
seeds) computes only the cells that have none.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from ps.experiments.grid import Cell

CELLS_DIR = "cells"


def cell_path(out: Path, cell: Cell) -> Path:
    return out / CELLS_DIR / f"{cell.key}.json"


def load_cell(out: Path, cell: Cell) -> dict[str, Any] | None:
    """The cached result of ``cell``, or None if it has not finished."""
    try:
        return json.loads(cell_path(out, cell).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


_datasets: dict[tuple[str, str | None, int], Any] = {}


def run_cell(cell: Cell, data_dir: str | None, eval_every: int,
             eval_samples: int | None) -> dict[str, Any]:
    """Train ``cell`` with the reference engine; its evaluation points and final hash."""
    import torch

    from common.data import load_dataset
    from common.model_init import initial_parameters
    from ps.reference.engine import simulate
    from worker.evaluator import Evaluator

    torch.set_num_threads(1)  # one cell per core; and as the cluster's workers compute
    cfg, attack = cell.configs()
    key = (cfg.dataset, data_dir, cfg.seed)
    if key not in _datasets:
        _datasets[key] = load_dataset(cfg.dataset, data_dir, seed=cfg.seed)
    evaluator = Evaluator(cfg, _datasets[key], eval_samples)
    points = []

    def record(t: int, params) -> None:
        e = evaluator.evaluate(params)
        points.append({"round": t, "top1": e.top1, "top3": e.top3, "loss": e.loss})

    record(0, initial_parameters(cfg))
    result = simulate(cfg, attack, dataset=_datasets[key], on_round=lambda t, sim: (
        record(t, sim.params()) if t % eval_every == 0 or t == cfg.rounds else None))
    return {"key": cell.key, "figure": cell.figure, "scenario": cell.scenario,
            "rule": cell.rule, "q": cfg.q, "batch_size": cfg.batch_size, "seed": cfg.seed,
            "rounds": cfg.rounds, "dataset": cfg.dataset, "seconds": result.seconds,
            "params_sha256": result.digest, "points": points}


def run_cells(cells: Iterable[Cell], out: Path, jobs: int, data_dir: str | None,
              eval_every: int, eval_samples: int | None,
              progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
              ) -> list[dict[str, Any]]:
    """Every cell's result: cached ones read, the others computed ``jobs`` at a time."""
    cells = list(cells)
    results: dict[str, dict[str, Any]] = {}
    todo: dict[str, Cell] = {}  # by key: a cell of two figures runs once
    for cell in cells:
        cached = load_cell(out, cell)
        if cached is not None:
            results[cell.key] = cached
        else:
            todo.setdefault(cell.key, cell)
    progress(f"{len(cells)} cells: {len(cells) - len(todo)} cached, {len(todo)} to run "
             f"({jobs} at a time)")
    (out / CELLS_DIR).mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        running = {pool.submit(run_cell, c, data_dir, eval_every, eval_samples): c
                   for c in todo.values()}
        done = 0
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                cell = running.pop(future)
                result = future.result()
                _write_atomically(cell_path(out, cell), result)
                results[cell.key] = result
                done += 1
                elapsed = time.monotonic() - started
                eta = elapsed / done * (len(todo) - done)
                last = result["points"][-1]
                progress(f"[{done}/{len(todo)}] {cell.label()}: top-1 {last['top1']:.3f} "
                         f"({result['seconds']:.0f} s); elapsed {elapsed:.0f} s, "
                         f"ETA {eta:.0f} s")
    return [{**results[c.key], "figure": c.figure} for c in cells]


def _write_atomically(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record) + "\n", encoding="utf-8")
    os.replace(tmp, path)
