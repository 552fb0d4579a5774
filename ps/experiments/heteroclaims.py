"""Claims of the literature on heterogeneous data, checked against a grid file's results
(``heterogeneity.toml``, or any grid with the cells a claim reads), split by split.

Each claim reads final accuracies (the metric at the last round, over seeds) by defence,
split (the partition with its alpha), worker momentum and attack, and is decided as in
:mod:`ps.experiments.claims` (the 95 % Student-t interval of a difference paired by
seed): it *holds* on a split when every comparison it makes holds,
*differs* when one fails, is *inconclusive* otherwise and *not run* where a cell it reads
is missing. A defence's *worst case* is, per seed, its lowest final over the attacks run
against it (``none`` excluded), then those minima over seeds.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ps.experiments.claims import (
    NEAR,
    NOT_RUN,
    Sample,
    Verdict,
    below,
    every,
    fixed,
    negate,
)
from ps.experiments.filereport import final, heterogeneity
from ps.experiments.grid import evaluated_on

MOMENTUM = 0.9  # the main table's
ROBUST = ("trimmed-mean", "krum", "geomed", "marmed")  # the rules NNM is put before
NO_ATTACK = "none"
MIMICS = ("mimic-adaptive", "mimic")  # Karimireddy et al.'s mimic first, then the simple one
NOT_APPLICABLE = "n/a"

Key = tuple[str, str, float, str]  # defence, split, momentum, attack


class Finals:
    """Final ``metric`` per (defence, split, momentum, attack), one value per seed (a
    diverged run counts as 0), paired by seed across cells."""

    def __init__(self, results: list[dict[str, Any]], metric: str) -> None:
        self.values: dict[Key, dict[int | None, float]] = defaultdict(dict)
        self.pooled: set[Key] = set()  # keys whose cells differ on another axis
        for r in results:
            if "partition" not in r.get("axes", {}):
                continue
            value = final(r, metric)
            key = (r["defence"], heterogeneity(r["axes"]), float(r["worker_momentum"]),
                   r["scenario"])
            if r.get("seed") in self.values[key]:
                self.pooled.add(key)
            self.values[key][r.get("seed")] = 0.0 if math.isnan(value) else value
        for key in self.pooled:
            del self.values[key]
        self.splits = list(dict.fromkeys(k[1] for k in self.values))

    def has(self, defence: str, split: str, momentum: float, attack: str) -> bool:
        return (defence, split, momentum, attack) in self.values

    def of(self, defence: str, split: str, momentum: float, attack: str) -> Sample:
        return Sample.of({_seed(s): v for s, v in
                          self.values[(defence, split, momentum, attack)].items()})

    def attacks(self, defence: str, split: str, momentum: float,
                among: tuple[str, ...] | None = None) -> list[str]:
        """The attacks run against ``defence`` there (``none`` excluded)."""
        return [k[3] for k in self.values if k[:3] == (defence, split, momentum)
                and k[3] != NO_ATTACK and (among is None or k[3] in among)]

    def worst(self, defence: str, split: str, momentum: float,
              among: tuple[str, ...] | None = None) -> tuple[str, Sample] | None:
        """``defence``'s worst case: per seed its lowest final over the attacks, over the
        seeds every attack ran (a minimum of means would be biased up); named after the
        attack worst on most seeds (ties: the lowest mean)."""
        found = self.attacks(defence, split, momentum, among)
        if not found:
            return None
        per_attack = {a: self.of(defence, split, momentum, a) for a in found}
        seeds = set.intersection(*(set(s.values or {}) for s in per_attack.values()))
        lows = {s: min((p.values or {})[s] for p in per_attack.values()) for s in seeds}
        worst_on = Counter(min(found, key=lambda a: (per_attack[a].values or {})[s])
                           for s in seeds)
        attack = min(found, key=lambda a: (-worst_on[a], per_attack[a].mean))
        return attack, Sample.of(lows)


def _seed(seed: int | None) -> int:
    """A cell without a seed is seed 0."""
    return 0 if seed is None else seed


@dataclass(frozen=True)
class HeteroClaim:
    """A sentence of a paper, where it says it, and its check on one split."""

    text: str
    source: str
    check: Callable[[Finals, str], Verdict]


def _robust_alone_lose(f: Finals, split: str) -> Verdict:
    """Each robust rule alone, without attack, below Mean without attack (a claim about
    heterogeneous splits: not applicable to the iid one)."""
    if split == "iid":
        return Verdict(NOT_APPLICABLE, "a claim about heterogeneous data")
    rules = [r for r in ROBUST if f.has(r, split, MOMENTUM, NO_ATTACK)]
    if not rules or not f.has("mean", split, MOMENTUM, NO_ATTACK):
        return Verdict(NOT_RUN, "no robust rule or no Mean without attack")
    mean = f.of("mean", split, MOMENTUM, NO_ATTACK)
    return Verdict.of(every(below(f.of(r, split, MOMENTUM, NO_ATTACK), mean) for r in rules),
                      f"mean {mean.text()}; " + "; ".join(
                          f"{r} {f.of(r, split, MOMENTUM, NO_ATTACK).text()}" for r in rules))


Cell = tuple[str, str, float]  # defence, split, momentum


def _worst_over_shared(f: Finals, a: Cell, b: Cell
                       ) -> tuple[tuple[str, Sample] | None, tuple[str, Sample] | None]:
    """The worst cases of ``a`` and ``b`` over the attacks run against both (a worst case
    over more attacks would be lower for that alone)."""
    shared = tuple(set(f.attacks(*a)) & set(f.attacks(*b)))
    if not shared:
        return None, None
    return f.worst(*a, shared), f.worst(*b, shared)


def _recovers(pre: str, rules: tuple[str, ...]) -> Callable[[Finals, str], Verdict]:
    """``pre`` before each rule: its worst case above the rule's alone (over the attacks
    run against both)."""
    def check(f: Finals, split: str) -> Verdict:
        compared = [(r, *_worst_over_shared(f, (r, split, MOMENTUM),
                                            (f"{pre}+{r}", split, MOMENTUM))) for r in rules]
        pairs = [(r, alone, after) for r, alone, after in compared if alone and after]
        if not pairs:
            return Verdict(NOT_RUN, f"no attacked {pre}+rule beside its rule")
        return Verdict.of(
            every(below(alone[1], after[1]) for _, alone, after in pairs),
            "; ".join(f"{r} {alone[1].text()} ({alone[0]}) -> {pre}+{r} {after[1].text()} "
                      f"({after[0]})" for r, alone, after in pairs))
    return check


def _mimic_costs(f: Finals, split: str) -> Verdict:
    """Mimic costs each robust rule (alone and after NNM) more than ``NEAR`` against its
    final without attack: Karimireddy et al.'s own, adaptive mimic where it ran (the
    worker furthest along the honest vectors' top direction), else the simple one."""
    attack = next((a for a in MIMICS if any(k[1] == split and k[3] == a for k in f.values)),
                  MIMICS[0])
    defences = [d for r in ROBUST for d in (r, f"nnm+{r}")
                if f.has(d, split, MOMENTUM, attack) and f.has(d, split, MOMENTUM, NO_ATTACK)]
    if not defences:
        return Verdict(NOT_RUN, "no mimic run beside its no-attack run")
    return Verdict.of(
        every(below(f.of(d, split, MOMENTUM, attack),
                    f.of(d, split, MOMENTUM, NO_ATTACK) + fixed(-NEAR)) for d in defences),
        f"{attack}: " + "; ".join(f"{d} {f.of(d, split, MOMENTUM, attack).text()} vs "
                                  f"{f.of(d, split, MOMENTUM, NO_ATTACK).text()}"
                                  for d in defences))


def _momentum_helps(f: Finals, split: str) -> Verdict:
    """Each defence run at momentum 0: its worst case over the attacks run at both momenta
    higher with momentum."""
    compared = [(d, *_worst_over_shared(f, (d, split, 0.0), (d, split, MOMENTUM)))
                for d in dict.fromkeys(k[0] for k in f.values if k[1:3] == (split, 0.0))]
    rows = [(d, without, with_) for d, without, with_ in compared if without and with_]
    if not rows:
        return Verdict(NOT_RUN, "no defence run at both momenta")
    return Verdict.of(
        every(below(without[1], with_[1]) for _, without, with_ in rows),
        "; ".join(f"{d} {without[1].text()} ({without[0]}) -> {with_[1].text()} ({with_[0]})"
                  for d, without, with_ in rows))


def _close_to_iid(f: Finals, split: str) -> Verdict:
    """NNM before each robust rule: its worst case no more than ``NEAR`` below its iid
    one (over the attacks run on both splits)."""
    if split == "iid":
        return Verdict(NOT_APPLICABLE, "the iid split itself")
    compared = [(d, *_worst_over_shared(f, (d, split, MOMENTUM), (d, "iid", MOMENTUM)))
                for d in (f"nnm+{r}" for r in ROBUST)]
    rows = [(d, here, iid) for d, here, iid in compared if here and iid]
    if not rows:
        return Verdict(NOT_RUN, "no attacked nnm+rule on this split and iid")
    return Verdict.of(
        every(negate(below(here[1], iid[1] + fixed(-NEAR))) for _, here, iid in rows),
        "; ".join(f"{d} {here[1].text()} ({here[0]}) vs iid {iid[1].text()}"
                  for d, here, iid in rows))


KARIMIREDDY = "Karimireddy, He, Jaggi, ICLR 2022"
ALLOUAH = "Allouah et al., AISTATS 2023"

HETERO_CLAIMS: tuple[HeteroClaim, ...] = (
    HeteroClaim("robust rules alone lose accuracy without attack (below Mean) on "
                "heterogeneous data",
                f"{KARIMIREDDY}: robust aggregators fail on non-iid data without "
                "Byzantine workers", _robust_alone_lose),
    HeteroClaim("NNM before a rule raises its worst case",
                f"{ALLOUAH}: NNM adapts a rule to heterogeneity", _recovers("nnm", ROBUST)),
    HeteroClaim("NNM keeps a rule's worst case no more than 0.05 below its iid one",
                f"{ALLOUAH}: optimal resilience under heterogeneity, read as no loss to it",
                _close_to_iid),
    HeteroClaim("bucketing before a rule raises its worst case",
                f"{KARIMIREDDY}: bucketing makes a rule robust on non-iid data",
                _recovers("bucketing", ("geomed", "centered-clipping"))),
    HeteroClaim("mimic costs every robust rule more than 0.05 (expected: not on iid data)",
                f"{KARIMIREDDY}: the mimic attack, strong on non-iid data", _mimic_costs),
    HeteroClaim("momentum 0.9 raises the worst case over the attacks run at both momenta",
                f"{ALLOUAH} (NNM with heavy-ball momentum); Karimireddy, He, Jaggi, ICML "
                "2021 (momentum against attacks that hide in the variance)", _momentum_helps),
)


def hetero_claim_lines(results: list[dict[str, Any]], metric: str) -> list[str]:
    """Markdown: each claim's verdict per split, then the numbers; nothing when the
    results have no partition axis or no claim reads any of their cells."""
    f = Finals(results, metric)
    if f.pooled:
        return ["", "## Claims on heterogeneous data", "",
                f"Not checked: {len(f.pooled)} (defence, split, momentum, attack) groups "
                "hold runs of one seed that differ on another axis of the grid, and "
                "would be pooled."]
    verdicts = {(c.text, s): c.check(f, s) for c in HETERO_CLAIMS for s in f.splits}
    if all(v.outcome in (NOT_RUN, NOT_APPLICABLE) for v in verdicts.values()):
        return []
    lines = ["", f"## Claims on heterogeneous data (final {evaluated_on(results)} {metric})",
             "",
             f"Worker momentum {MOMENTUM:g} unless the claim is about it; verdicts by the "
             "95 % interval of each difference paired by seed (see the paper's claims).",
             "",
             "| claim | source | " + " | ".join(f.splits) + " |",
             "|---|---|" + "---|" * len(f.splits)]
    for c in HETERO_CLAIMS:
        lines.append(f"| {c.text} | {c.source} | "
                     + " | ".join(verdicts[(c.text, s)].outcome for s in f.splits) + " |")
    lines += ["", "The numbers (mean ± half the 95 % interval; the worst attack in brackets):",
              ""]
    for c in HETERO_CLAIMS:
        for s in f.splits:
            v = verdicts[(c.text, s)]
            if v.outcome not in (NOT_RUN, NOT_APPLICABLE):
                lines.append(f"* {c.text}, {s}: **{v.outcome}**: {v.evidence}")
    return lines

