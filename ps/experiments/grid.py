"""The cells of an experiment grid: one training run each, keyed by its settings.

The paper's MNIST grid (Xie, Koyejo, Gupta 2018, Sec. 6; ``shared/paper-notes.md``):
the rules x five scenarios (no attack; Gaussian, omniscient: 6 of n = 20 workers;
bit-flip on the first 1000 coordinates; gambler with the model over 20 servers), n = 20,
batch 32, lr 0.1, q = 8 where the rule allows it, the MLP, several seeds; and two
sweeps: q for Krum, Multi-Krum and MeaMed under bit-flip, and the batch size without
attack (lr = 0.1 x batch / 32).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from common.config import AttackConfig, RunConfig
from common.errors import ConfigError
from common.rules import RuleError, rule_class

PAPER_RULES = ("mean", "medoid", "krum", "multikrum", "geomed", "marmed", "meamed")
EXTRA_RULES = ("trimmed-mean", "bulyan")
SCENARIOS = ("none", "gaussian", "omniscient", "bitflip", "gambler")
PAPER_Q = 8
BYZANTINE = tuple(range(6))  # 6 of the 20 workers in the classic-model scenarios
Q_SWEEP_RULES = ("krum", "multikrum", "meamed")
Q_SWEEP = (2, 4, 6, 8)
BATCH_SWEEP = (8, 16, 32, 64, 128)


def scenario_settings(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(run settings, attack settings) that make scenario ``name``."""
    if name == "none":
        return {}, {}
    if name in ("gaussian", "omniscient"):
        return {}, {"worker_attack": name, "byzantine_workers": BYZANTINE}
    if name == "bitflip":  # shard 0 holds the first coordinates
        return {}, {"proxy_attack": "bitflip", "proxy_shards": (0,)}
    if name == "gambler":  # the model over 20 servers, one of them behind the proxy
        return {"num_shards": 20}, {"proxy_attack": "gambler", "proxy_shards": (0,)}
    raise ConfigError(f"unknown scenario {name!r}; valid: {', '.join(SCENARIOS)}")


def largest_q(rule: str, n: int, wanted: int) -> int:
    """``wanted``, or the largest q below it that ``rule`` accepts with n workers."""
    for q in range(wanted, -1, -1):
        try:
            rule_class(rule).check(n, q)
            return q
        except RuleError:
            continue
    raise ConfigError(f"rule {rule} accepts no q <= {wanted} with n={n}")


@dataclass(frozen=True)
class Cell:
    """One run of the grid: a figure it belongs to, its settings, its cache key."""

    figure: str  # "paper", "q-sweep" or "batch-sweep"
    scenario: str
    run: dict[str, Any] = field(hash=False)
    attack: dict[str, Any] = field(hash=False)

    @property
    def rule(self) -> str:
        return self.run["rule"]

    @property
    def seed(self) -> int:
        return self.run["seed"]

    def configs(self) -> tuple[RunConfig, AttackConfig]:
        cfg = RunConfig(**self.run).validate()
        return cfg, AttackConfig.build(**self.attack).validate(cfg)

    @cached_property
    def key(self) -> str:
        """Stable hash of every setting that changes the result (not the figure)."""
        cfg, attack = self.configs()
        text = json.dumps({"run": cfg.to_dict(), "attack": attack.to_dict()},
                          sort_keys=True, default=list)
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def label(self) -> str:
        extra = f" q={self.run['q']}" if self.figure == "q-sweep" else ""
        if self.figure == "batch-sweep":
            extra = f" batch={self.run['batch_size']}"
        return f"{self.figure}/{self.scenario}/{self.rule}{extra}/seed {self.seed}"


@dataclass(frozen=True)
class GridSpec:
    """What grid to run: the common settings and which parts."""

    dataset: str = "fashion-mnist"
    model: str = "mlp"
    num_workers: int = 20
    rounds: int = 500
    seeds: int = 2
    lr: float = 0.1
    batch_size: int = 32
    rules: tuple[str, ...] = PAPER_RULES + EXTRA_RULES
    scenarios: tuple[str, ...] = SCENARIOS
    sweeps: bool = True

    def base(self, seed: int) -> dict[str, Any]:
        return {"dataset": self.dataset, "model": self.model, "num_workers": self.num_workers,
                "num_shards": 4, "rounds": self.rounds, "lr": self.lr,
                "batch_size": self.batch_size, "seed": seed}


def paper_cells(spec: GridSpec) -> list[Cell]:
    """Every cell of the grid ``spec`` describes, the main grid first."""
    n = spec.num_workers
    cells = []
    for seed in range(spec.seeds):
        for scenario in spec.scenarios:
            run_extra, attack = scenario_settings(scenario)
            for rule in spec.rules:
                run = {**spec.base(seed), **run_extra, "rule": rule,
                       "q": largest_q(rule, n, PAPER_Q)}
                cells.append(Cell("paper", scenario, run, attack))
    if not spec.sweeps:
        return cells
    for seed in range(spec.seeds):
        _, attack = scenario_settings("bitflip")
        for rule in Q_SWEEP_RULES:
            for q in Q_SWEEP:
                if q == largest_q(rule, n, q):
                    cells.append(Cell("q-sweep", "bitflip",
                                      {**spec.base(seed), "rule": rule, "q": q}, attack))
        for batch in BATCH_SWEEP:
            run = {**spec.base(seed), "rule": "mean", "q": 0, "batch_size": batch,
                   "lr": spec.lr * batch / 32}
            cells.append(Cell("batch-sweep", "none", run, {}))
    return _unique(cells)


def _unique(cells: list[Cell]) -> list[Cell]:
    """Cells whose settings repeat (a sweep point equal to a grid cell) once, first kept."""
    seen: set[tuple[str, str]] = set()
    out = []
    for cell in cells:
        if (cell.figure, cell.key) not in seen:
            seen.add((cell.figure, cell.key))
            out.append(cell)
    return out
