"""The float32 hypothesis for Medoid under the omniscient attack, tested by a run.

The paper says Medoid fails under the omniscient attack (6 of 20 workers send -1e20 x the
sum of the honest gradients); ours converges (``docs/results.md``). Our Medoid measures
distances in a float64 Gram matrix (``kernels.gram64``): the forged vectors, about 1e21
per value, are the farthest from everything and never chosen. The hypothesis: computed
in float32, as a framework of 2018 would (the paper's MXNet code works in float32),
their squared distances overflow to inf, every row's summed distance is inf (each
honest row is at inf from the forged ones too), and ``argmin`` takes the first row:
Byzantine worker 0's forged vector.

:class:`Float32Medoid` is that naive Medoid: the summed Euclidean distance of each row to
all rows, computed in float32 exactly as written, the lowest index on ties. It is
registered as rule ``medoid-float32`` only while :func:`compare` runs (nothing happens at
import), which trains it and our Medoid on the same seeds with the reference engine.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.learn.rules.base import RULES, Rule

RULE = "medoid-float32"


class Float32Medoid(Rule):
    """Medoid with its distances summed in float32 (overflowing to inf as they may);
    ``last_info["selected"]``."""

    name = RULE
    summary = "Medoid with float32 distances (the float32 hypothesis; not for use)"

    def aggregate(self, G: torch.Tensor) -> torch.Tensor | np.ndarray:
        rows = torch.as_tensor(G, dtype=torch.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            scores = torch.stack([((rows - row) ** 2).sum(dim=1).sqrt().sum()
                                  for row in rows])
        # NaN (inf - inf) scores as inf; ties (all inf) go to the lowest index
        scores = torch.nan_to_num(scores, nan=float("inf"))
        best = int(torch.argmin(scores))
        self.last_info = {"selected": [best], "score": float(scores[best])}
        return rows[best].clone()


@contextmanager
def registered() -> Iterator[None]:
    """``medoid-float32`` in the rule registry for the duration."""
    RULES.register(Float32Medoid)
    try:
        yield
    finally:
        del RULES[RULE]


def compare(seeds: int, rounds: int, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Medoid and the float32 Medoid under the paper's omniscient scenario (n = 20, 6
    Byzantine, S = 4, q = 8, batch 32, lr 0.1, Fashion-MNIST, the MLP), each seed: the
    final top-1 accuracy, and how often a forged row was selected."""
    from common.learn.data import load_dataset
    from ps.experiments.grid import Cell, GridSpec, largest_q, scenario_settings
    from ps.reference.engine import simulate
    from worker.evaluator import Evaluator

    torch.set_num_threads(1)
    spec = GridSpec(rounds=rounds)
    run_extra, attack_settings = scenario_settings("omniscient", spec.num_workers)
    byzantine = set(attack_settings["byzantine_workers"])
    out: dict[str, Any] = {"rounds": rounds, "runs": []}
    with registered():
        for seed in range(seeds):
            dataset = load_dataset(spec.dataset, None, seed=seed)
            for rule in ("medoid", RULE):
                run = {**spec.base(seed), **run_extra, "rule": rule,
                       "q": largest_q("medoid", spec.num_workers, 8)}
                cfg, attack = Cell("paper", "omniscient", run, attack_settings).configs()
                forged = [0, 0]  # (selections of a forged row, selections)

                def count(t: int, sim: Any, forged: list[int] = forged) -> None:
                    for metrics in sim.last_metrics:
                        chosen = [metrics.workers[i]
                                  for i in metrics.rule_info.get("selected", [])]
                        forged[0] += sum(w in byzantine for w in chosen)
                        forged[1] += len(chosen)

                started = time.perf_counter()
                result = simulate(cfg, attack, dataset=dataset, on_round=count)
                top1 = Evaluator(cfg, dataset, None).evaluate(result.params).top1
                record = {"rule": rule, "seed": seed, "top1": top1,
                          "forged_selected": forged[0], "selections": forged[1],
                          "seconds": round(time.perf_counter() - started, 1),
                          "params_sha256": result.digest}
                say(json.dumps(record))
                out["runs"].append(record)
    return out


def write(out_dir: Path, seeds: int, rounds: int) -> Path:
    """Run :func:`compare`; write ``medoid-float32.json`` and ``report.md`` into
    ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "medoid-float32.json"
    path.write_text(json.dumps(compare(seeds, rounds), indent=1) + "\n", encoding="utf-8")
    return write_report(out_dir)


def write_report(out_dir: Path) -> Path:
    """``report.md``: the runs of ``medoid-float32.json`` as a table."""
    found = json.loads((out_dir / "medoid-float32.json").read_text(encoding="utf-8"))
    lines = ["# Medoid under the omniscient attack: float64 against float32 distances", "",
             "* Command: `python3 scripts/medoid_float32.py --out docs/results/medoid-float32 "
             f"--seeds {len({r['seed'] for r in found['runs']})}`",
             f"* The paper's omniscient scenario ({found['rounds']} rounds, Fashion-MNIST, "
             "the MLP, n = 20, 6 Byzantine, S = 4: Medoid selects per shard)", "",
             "| rule | seed | final top1 | forged rows selected / selections |",
             "|---|---|---|---|"]
    lines += [f"| {r['rule']} | {r['seed']} | {r['top1']:.4f} | {r['forged_selected']} / "
              f"{r['selections']} |" for r in found["runs"]]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
