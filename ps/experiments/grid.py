"""The cells of an experiment grid: one training run each, keyed by its settings.

The paper's MNIST grid (Xie, Koyejo, Gupta 2018, Sec. 6; ``docs/paper.md``, "The experiments"):
the rules x five scenarios (no attack; Gaussian, omniscient: 6 of n = 20 workers;
bit-flip on the first 1000 coordinates; gambler with the model over 20 servers), n = 20,
batch 32, lr 0.1, q = 8 where the rule allows it, the MLP, several seeds; and two
sweeps: q for Krum, Multi-Krum and MeaMed under bit-flip and under the gambler, and the
batch size for every rule without attack (lr = 0.1 x batch / 32). CIFAR-10 uses the
CNN, lr 5e-4, batch 128, 4000 rounds and top-3 accuracy.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from common.errors import ConfigError
from common.learn.rules import RuleError, rule_class
from common.run.config import AttackConfig, RunConfig

PAPER_RULES = ("mean", "medoid", "krum", "multikrum", "geomed", "marmed", "meamed")
EXTRA_RULES = ("trimmed-mean", "bulyan")
SCENARIOS = ("none", "gaussian", "omniscient", "bitflip", "gambler")
PAPER_Q = 8
BYZANTINE_SHARE = (6, 20)  # 6 of the 20 workers in the classic-model scenarios
Q_SWEEP_RULES = ("krum", "multikrum", "meamed")
Q_SWEEP = (2, 4, 6, 8)
Q_SWEEP_SCENARIOS = ("bitflip", "gambler")


def byzantine_workers(n: int) -> tuple[int, ...]:
    """The first 6/20 of the ``n`` workers (the paper's 6 of 20), rounded down."""
    return tuple(range(n * BYZANTINE_SHARE[0] // BYZANTINE_SHARE[1]))


def scenario_settings(name: str, n: int = 20) -> tuple[dict[str, Any], dict[str, Any]]:
    """(run settings, attack settings) that make scenario ``name`` with ``n`` workers."""
    if name == "none":
        return {}, {}
    if name in ("gaussian", "omniscient"):
        return {}, {"worker_attack": name, "byzantine_workers": byzantine_workers(n)}
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


# bump when a default or the meaning of a setting changes: every cached cell is then stale
CELL_FORMAT = 1


def _changed(settings: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in settings.items() if k not in defaults or defaults[k] != v}


@dataclass(frozen=True)
class Cell:
    """One run of the grid: a figure it belongs to, its settings, its cache key."""

    figure: str  # "paper", "q-sweep", "batch-sweep" or "modern"
    scenario: str
    run: dict[str, Any] = field(hash=False)
    attack: dict[str, Any] = field(hash=False)

    @property
    def rule(self) -> str:
        return self.run["rule"]

    @property
    def defence(self) -> str:
        """The rule, after its pre-aggregation chain if any: ``nnm+trimmed-mean``."""
        pre = self.run.get("pre")
        return "+".join([*pre.split(","), self.rule]) if pre else self.rule

    @property
    def seed(self) -> int:
        return self.run["seed"]

    def configs(self) -> tuple[RunConfig, AttackConfig]:
        cfg = RunConfig.from_settings(**self.run).validate()
        return cfg, AttackConfig.build(**self.attack).validate(cfg)

    @cached_property
    def key(self) -> str:
        """Stable hash of the settings that differ from their defaults (not the figure),
        and of ``CELL_FORMAT``: a setting added later with a default that keeps the old
        behaviour leaves every cached cell valid."""
        cfg, attack = self.configs()
        # the defaults as they are now: a plugin loaded (its options, its attack's
        # parameters) is at its defaults on both sides and leaves the key what it was
        text = json.dumps({"format": CELL_FORMAT,
                           "run": _changed(cfg.to_dict(), RunConfig().to_dict()),
                           "attack": _changed(attack.to_dict(), AttackConfig().to_dict())},
                          sort_keys=True, default=list)
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def tags(self) -> dict[str, Any]:
        """What the cell's result records beside its run's (a cached run may serve cells
        of several figures): n, f and S for the figures' captions, and under
        ``--validation`` its share (the points are the validation split's, not the test
        set's)."""
        cfg, attack = self.configs()
        return {"figure": self.figure, "num_workers": cfg.num_workers,
                "num_byzantine": sum(map(attack.is_byzantine, range(cfg.num_workers))),
                "num_shards": cfg.num_shards,
                **({"validation": cfg.validation} if cfg.validation else {})}

    def label(self) -> str:
        extra = f" q={self.run['q']}" if self.figure == "q-sweep" else ""
        if self.figure == "batch-sweep":
            extra = f" batch={self.run['batch_size']}"
        if self.figure == "modern":
            extra = f" momentum={self.run.get('worker_momentum', 0.0):g}"
        return f"{self.figure}/{self.scenario}/{self.defence}{extra}/seed {self.seed}"


def evaluated_on(results: Iterable[dict[str, Any]]) -> str:
    """What the points of ``results`` measure: ``test``, ``validation`` (cells run under
    ``--validation``, tagged by :meth:`Cell.tags`) or, mixed, ``test and validation``."""
    return " and ".join(sorted({"validation" if r.get("validation") else "test"
                                for r in results}))


@dataclass(frozen=True)
class Recipe:
    """The paper's training settings for a dataset (Sec. 6; ``docs/paper.md``)."""

    model: str
    lr: float
    batch_size: int
    rounds: int
    metric: str  # "top1" or "top3": what the paper plots


MNIST_RECIPE = Recipe(model="mlp", lr=0.1, batch_size=32, rounds=500, metric="top1")
RECIPES = {"cifar10": Recipe(model="cnn", lr=5e-4, batch_size=128, rounds=4000, metric="top3")}


def recipe(dataset: str) -> Recipe:
    """CIFAR-10's settings for cifar10; the MNIST settings for every MNIST-like set."""
    return RECIPES.get(dataset, MNIST_RECIPE)


@dataclass(frozen=True)
class GridSpec:
    """What grid to run: the common settings and which parts."""

    dataset: str = "fashion-mnist"
    model: str = "mlp"
    num_workers: int = 20
    num_shards: int = 4  # the paper's gambler scenario sets its own 20
    rounds: int = 500
    seeds: int = 3  # a spread for the verdicts (2 seldom decide one)
    lr: float = 0.1
    batch_size: int = 32
    rules: tuple[str, ...] = PAPER_RULES + EXTRA_RULES
    scenarios: tuple[str, ...] = SCENARIOS
    sweeps: bool = True

    @classmethod
    def for_dataset(cls, dataset: str, **changes: Any) -> GridSpec:
        """The paper's settings for ``dataset``; ``changes`` (not None) override them."""
        r = recipe(dataset)
        base = {"model": r.model, "lr": r.lr, "batch_size": r.batch_size, "rounds": r.rounds}
        return cls(dataset=dataset, **{**base, **{k: v for k, v in changes.items()
                                                  if v is not None}})

    def base(self, seed: int) -> dict[str, Any]:
        return {"dataset": self.dataset, "model": self.model, "num_workers": self.num_workers,
                "num_shards": self.num_shards, "rounds": self.rounds, "lr": self.lr,
                "batch_size": self.batch_size, "seed": seed}

    def batch_sweep(self) -> tuple[int, ...]:
        """Batch sizes around the paper's: 1/4, 1/2, 1, 2 and 4 times it."""
        return tuple(max(1, self.batch_size * k // 4) for k in (1, 2, 4, 8, 16))


def paper_cells(spec: GridSpec) -> list[Cell]:
    """Every cell of the grid ``spec`` describes, seed by seed (an interrupted grid has
    every figure's cells of its first seeds: each claim reads them paired by seed), the
    main grid first in each seed."""
    cells = []
    for seed in range(spec.seeds):
        cells += _main_cells(spec, seed)
        if spec.sweeps:
            cells += _q_sweep_cells(spec, seed) + _batch_sweep_cells(spec, seed)
    return _unique(cells)


def _main_cells(spec: GridSpec, seed: int) -> list[Cell]:
    """The rules x scenarios at the paper's q (or the largest below it a rule takes)."""
    cells = []
    for scenario in spec.scenarios:
        run_extra, attack = scenario_settings(scenario, spec.num_workers)
        for rule in spec.rules:
            run = {**spec.base(seed), **run_extra, "rule": rule,
                   "q": largest_q(rule, spec.num_workers, PAPER_Q)}
            cells.append(Cell("paper", scenario, run, attack))
    return cells


def _q_sweep_cells(spec: GridSpec, seed: int) -> list[Cell]:
    """q for Krum, Multi-Krum and MeaMed under bit-flip and under the gambler (the
    paper: the Krum-based rules stay stuck whatever q; MeaMed fails at q = 2)."""
    cells = []
    for scenario in Q_SWEEP_SCENARIOS:
        run_extra, attack = scenario_settings(scenario, spec.num_workers)
        for rule in Q_SWEEP_RULES:
            for q in Q_SWEEP:
                if q == largest_q(rule, spec.num_workers, q):
                    cells.append(Cell("q-sweep", scenario, {**spec.base(seed), **run_extra,
                                                            "rule": rule, "q": q}, attack))
    return cells


def _batch_sweep_cells(spec: GridSpec, seed: int) -> list[Cell]:
    """Every rule without attack at each batch size, lr scaled with it (the paper: 0.1 x
    b / 32), at the main grid's q (Mean: 0, as the sweep first ran it: Mean reads no q)."""
    cells = []
    for rule in spec.rules:
        q = 0 if rule == "mean" else largest_q(rule, spec.num_workers, PAPER_Q)
        for batch in spec.batch_sweep():
            run = {**spec.base(seed), "rule": rule, "q": q, "batch_size": batch,
                   "lr": spec.lr * batch / spec.batch_size}
            cells.append(Cell("batch-sweep", "none", run, {}))
    return cells


def _unique(cells: list[Cell]) -> list[Cell]:
    """Cells whose settings repeat (a sweep point equal to a grid cell) once, first kept."""
    seen: set[tuple[str, str]] = set()
    out = []
    for cell in cells:
        if (cell.figure, cell.key) not in seen:
            seen.add((cell.figure, cell.key))
            out.append(cell)
    return out
