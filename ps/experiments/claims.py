"""The paper's claims (``docs/paper.md``, "What the paper says about its figures"), each checked
against a grid's results with stated thresholds, and the numbers that decide it.

Words of the paper, as measured here (final = the metric at the last round, mean over
seeds; speed = the mean of the metric over all evaluation points, an area under the
curve):

* *fails*: final below chance + ``FAIL_MARGIN``;
* *converges*: final at least ``CONVERGED`` x Mean's final without attack;
* *~ X*: finals within ``CLOSE``; *close to X*: within ``NEAR``;
* *slower*: a lower speed; *slightly slower*: slower, final within ``NEAR``;
* *a bad solution*: neither fails nor ends within ``NEAR`` of its own no-attack final.

The margin rule: every comparison of a mean over seeds with a threshold or with another
mean is decided only when the difference lies beyond ``MARGIN_SE`` standard errors of
the difference, SE = sqrt(s_a^2 / n_a + s_b^2 / n_b) (s: the standard deviation over
seeds, n: the number of seeds; a fixed threshold has no error). ``a < b`` holds when
``mean_a - mean_b < -MARGIN_SE x SE``, fails when it is above ``+MARGIN_SE x SE``, and is
*inconclusive* in between; *within t* holds when ``|difference| + MARGIN_SE x SE <= t``
and fails when ``|difference| - MARGIN_SE x SE > t`` (an equivalence test). Two standard
errors are about a 95 % interval under a normal approximation (a t-test with 3 to 5 seeds
asks for 2.8 to 4.3: the rule is a screen, not a significance test). Every comparison
needs a spread: a mean over a single seed has none, so every verdict that reads it is
inconclusive. A claim of several comparisons holds when all hold, differs when one
differs, and is inconclusive otherwise.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

FAIL_MARGIN = 0.1
CONVERGED = 0.9
CLOSE = 0.02
NEAR = 0.05
MARGIN_SE = 2.0  # a difference is decided beyond this many standard errors
CHANCE = {"top1": 0.1, "top3": 0.3}  # 10 classes
KRUM_BASED = ("krum", "multikrum")

HOLDS = "holds"
DIFFERS = "differs"
INCONCLUSIVE = "inconclusive"
NOT_RUN = "not run"

Outcome = bool | None  # one comparison: True, False, or None (inside the margin)


@dataclass(frozen=True)
class Sample:
    """One quantity over seeds: its mean and the standard error of that mean (NaN with a
    single seed: no spread), or a fixed threshold (``se`` 0)."""

    mean: float
    se: float

    @classmethod
    def of(cls, values: list[float]) -> Sample:
        spread = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 \
            else math.nan
        return cls(statistics.fmean(values), spread)

    def __add__(self, other: Sample) -> Sample:
        return Sample(self.mean + other.mean, math.hypot(self.se, other.se))

    def __mul__(self, factor: float) -> Sample:
        return Sample(self.mean * factor, self.se * abs(factor))

    def text(self) -> str:
        """``0.812 ± 0.010`` (± MARGIN_SE standard errors), or ``0.812 (1 seed)``."""
        if math.isnan(self.se):
            return f"{self.mean:.3f} (1 seed)"
        return f"{self.mean:.3f} ± {MARGIN_SE * self.se:.3f}"


def fixed(value: float) -> Sample:
    """A threshold: no error."""
    return Sample(value, 0.0)


def below(a: Sample, b: Sample) -> Outcome:
    """``a < b`` decided by the margin rule; None when the difference is inside the
    margin, or when a side has no spread (a single seed)."""
    margin = MARGIN_SE * math.hypot(a.se, b.se)  # NaN without a spread: both tests fail
    difference = a.mean - b.mean
    if difference < -margin:
        return True
    if difference > margin:
        return False
    return None


def within(a: Sample, b: Sample, tolerance: float) -> Outcome:
    """``|a - b| <= tolerance`` decided by the margin rule (an equivalence test)."""
    margin = MARGIN_SE * math.hypot(a.se, b.se)  # NaN without a spread: both tests fail
    gap = abs(a.mean - b.mean)
    if gap + margin <= tolerance:
        return True
    if gap - margin > tolerance:
        return False
    return None


def every(outcomes: Iterable[Outcome]) -> Outcome:
    """All hold: True; one fails: False; otherwise None (Kleene's "and")."""
    values = list(outcomes)
    if any(v is False for v in values):
        return False
    return True if all(v is True for v in values) else None


def negate(outcome: Outcome) -> Outcome:
    return None if outcome is None else not outcome


def ties(worst: list[float], others: dict[str, list[float]]) -> list[str] | None:
    """A worst case's ties: the names in ``others`` (each a value per seed) whose mean is
    not above the ``worst`` one's by the margin rule; None with a single seed (no spread
    to rank by). A diverged value (NaN) counts as 0."""
    if len(worst) < 2:
        return None
    low = Sample.of([_value(v) for v in worst])
    return [name for name, values in others.items()
            if below(low, Sample.of([_value(v) for v in values])) is not True]


def ties_text(found: list[str] | None) -> str:
    """``; ~ a, b`` after a worst case with ties, else nothing."""
    return f"; ~ {', '.join(found)}" if found else ""


TIES_RULE = (f"After *~*: the values not above the worst by the margin rule ({MARGIN_SE:g} "
             "standard errors of the difference over seeds), so not ranked apart from it; "
             "with a single seed nothing is ranked.")


@dataclass
class Verdict:
    """Whether a claim holds here (``outcome``: holds, differs, inconclusive, not run),
    and the numbers that say so."""

    outcome: str
    evidence: str

    @classmethod
    def of(cls, outcome: Outcome, evidence: str) -> Verdict:
        return cls({True: HOLDS, False: DIFFERS, None: INCONCLUSIVE}[outcome], evidence)


class Measures:
    """Final values and speeds per (rule, scenario) of the main grid, and the q sweep."""

    def __init__(self, results: list[dict[str, Any]], metric: str) -> None:
        self.metric = metric
        self.fail_below = fixed(CHANCE[metric] + FAIL_MARGIN)
        self._final: dict[tuple[str, str], list[float]] = {}
        self._speed: dict[tuple[str, str], list[float]] = {}
        self.q_sweep: dict[tuple[str, int], list[float]] = {}
        for r in results:
            values = [_value(p[metric]) for p in r["points"]]
            if r["figure"] == "paper":
                key = (r["rule"], r["scenario"])
                self._final.setdefault(key, []).append(values[-1])
                self._speed.setdefault(key, []).append(statistics.fmean(values))
            elif r["figure"] == "q-sweep":
                self.q_sweep.setdefault((r["rule"], r["q"]), []).append(values[-1])

    def has(self, rule: str, scenario: str) -> bool:
        return (rule, scenario) in self._final

    def final(self, rule: str, scenario: str) -> Sample:
        return Sample.of(self._final[(rule, scenario)])

    def speed(self, rule: str, scenario: str) -> Sample:
        return Sample.of(self._speed[(rule, scenario)])

    def rules(self, scenario: str, among: tuple[str, ...]) -> list[str]:
        return [r for r in among if self.has(r, scenario)]

    def fails(self, rule: str, scenario: str) -> Outcome:
        return below(self.final(rule, scenario), self.fail_below)

    def converges(self, rule: str, scenario: str) -> Outcome:
        return negate(below(self.final(rule, scenario),
                            self.final("mean", "none") * CONVERGED))

    def shown(self, rule: str, scenario: str) -> str:
        return f"{rule} {self.final(rule, scenario).text()}"


def _value(value: float | None) -> float:
    """A diverged evaluation (NaN) counts as 0: it certainly failed."""
    return value if value is not None and math.isfinite(value) else 0.0


@dataclass(frozen=True)
class Claim:
    """One sentence of the paper, the runs it needs and how it is checked."""

    scenario: str
    text: str
    rules: tuple[str, ...]  # the rules the check reads (besides Mean without attack)
    check: Callable[[Measures], Verdict]
    why_not: str = ""  # our explanation, shown when the claim does not hold here


def _all(m: Measures, rules: list[str], test: Callable[[str], Outcome], scenario: str,
         ) -> Verdict:
    return Verdict.of(every(test(r) for r in rules),
                      "; ".join(m.shown(r, scenario) for r in rules))


def _rank(among: list[str], expected: set[str], by: Callable[[str], Sample], label: str,
          ) -> Verdict:
    """``expected`` are the lowest of ``among`` by ``by``: each of them below each other
    rule (by the margin rule)."""
    others = [r for r in among if r not in expected]
    present = [e in among for e in sorted(expected)]  # False: one is not among them
    outcome = every([*present, *(below(by(e), by(o)) for e in sorted(expected)
                                 if e in among for o in others)])
    shown = ", ".join(f"{r} {by(r).text()}" for r in sorted(among, key=lambda r: by(r).mean))
    return Verdict.of(outcome, f"{label}, lowest first: {shown}")


def _only(m: Measures, scenario: str, among: list[str], expected: set[str]) -> Verdict:
    converged = {r: m.converges(r, scenario) for r in among}
    outcome = every(c if r in expected else negate(c) for r, c in converged.items())
    names = sorted(r for r, c in converged.items() if c is True)
    return Verdict.of(outcome, f"converged: {', '.join(names) or 'none'}; "
                      + "; ".join(m.shown(r, scenario) for r in among))


def _against_no_attack(m: Measures, scenario: str, rules: list[str]) -> str:
    return "; ".join(f"{r} {m.final(r, scenario).text()} vs {m.final(r, 'none').text()} "
                     "without attack" for r in rules)


def _like_no_attack(m: Measures, scenario: str, rules: list[str], tolerance: float,
                    ) -> Verdict:
    return Verdict.of(every(within(m.final(r, scenario), m.final(r, "none"), tolerance)
                            for r in rules), _against_no_attack(m, scenario, rules))


def _krum_stuck_whatever_q(m: Measures) -> Verdict:
    points = {k: Sample.of(v) for k, v in m.q_sweep.items() if k[0] in KRUM_BASED}
    main = {(r, "grid"): m.final(r, "bitflip") for r in KRUM_BASED if m.has(r, "bitflip")}
    if not points and not main:
        return Verdict(NOT_RUN, "no Krum-based run under bit-flip")
    values = [*points.values(), *main.values()]  # (their keys differ: q ints, "grid")
    return Verdict.of(every(below(v, m.fail_below) for v in values),
                      "; ".join(f"{rule} q={q} {v.text()}" for (rule, q), v in sorted(
                          points.items())) or "; ".join(f"{r} {v.text()}" for (r, _), v in
                                                         main.items()))


def _slower_but_close(m: Measures, rules: tuple[str, ...], scenario: str) -> Verdict:
    """Each rule's speed in ``scenario`` below Mean's without attack, and its final
    within ``NEAR`` below Mean's (not significantly lower than that)."""
    mean_final = m.final("mean", "none")
    return Verdict.of(
        every(every((below(m.speed(r, scenario), m.speed("mean", "none")),
                     negate(below(m.final(r, scenario), mean_final + fixed(-NEAR)))))
              for r in rules),
        "; ".join(f"{r} speed {m.speed(r, scenario).text()}, final "
                  f"{m.final(r, scenario).text()}" for r in rules)
        + f"; Mean without attack speed {m.speed('mean', 'none').text()}, final "
        f"{mean_final.text()}")


def _bad_solutions(m: Measures, rules: tuple[str, ...]) -> Verdict:
    return Verdict.of(
        every(every((negate(m.fails(r, "omniscient")),
                     below(m.final(r, "omniscient"), m.final(r, "none") + fixed(-NEAR))))
              for r in rules),
        _against_no_attack(m, "omniscient", list(rules)))


def _krum_slower(m: Measures) -> Verdict:
    krum = m.speed("krum", "omniscient")
    return Verdict.of(
        every((m.converges("krum", "omniscient"),
               *(below(krum, m.speed(r, "omniscient")) for r in ("meamed", "multikrum")))),
        f"final {m.final('krum', 'omniscient').text()}; speed krum {krum.text()}, meamed "
        f"{m.speed('meamed', 'omniscient').text()}, multikrum "
        f"{m.speed('multikrum', 'omniscient').text()}")


PAPER = ("mean", "medoid", "krum", "multikrum", "geomed", "marmed", "meamed")

CLAIMS: tuple[Claim, ...] = (
    Claim("none", "all rules converge", PAPER,
          lambda m: _all(m, m.rules("none", PAPER), lambda r: m.converges(r, "none"),
                         "none")),
    Claim("none", "GeoMed, Multi-Krum and MeaMed ~ Mean", ("geomed", "multikrum", "meamed"),
          lambda m: Verdict.of(every(within(m.final(r, "none"), m.final("mean", "none"),
                                            CLOSE)
                                     for r in ("geomed", "multikrum", "meamed")),
                               "; ".join(m.shown(r, "none") for r in
                                         ("mean", "geomed", "multikrum", "meamed")))),
    Claim("none", "MarMed slightly slower than Mean", ("marmed",),
          lambda m: _slower_but_close(m, ("marmed",), "none")),
    Claim("none", "Krum and Medoid slowest", PAPER,
          lambda m: _rank(m.rules("none", PAPER), {"krum", "medoid"},
                          lambda r: m.speed(r, "none"), "speed")),
    Claim("gaussian", "Mean fails", ("mean",),
          lambda m: Verdict.of(m.fails("mean", "gaussian"), m.shown("mean", "gaussian"))),
    Claim("gaussian", "the other rules converge", PAPER[1:],
          lambda m: _all(m, m.rules("gaussian", PAPER[1:]),
                         lambda r: m.converges(r, "gaussian"), "gaussian")),
    Claim("gaussian", "GeoMed and MeaMed ~ no attack", ("geomed", "meamed"),
          lambda m: _like_no_attack(m, "gaussian", ["geomed", "meamed"], CLOSE)),
    Claim("gaussian", "Medoid and Krum the worst of the survivors", PAPER,
          lambda m: _rank([r for r in m.rules("gaussian", PAPER)
                           if m.converges(r, "gaussian") is not False],
                          {"medoid", "krum"}, lambda r: m.final(r, "gaussian"), "final")),
    Claim("omniscient", "MeaMed ~ no attack", ("meamed",),
          lambda m: _like_no_attack(m, "omniscient", ["meamed"], CLOSE)),
    Claim("omniscient", "Multi-Krum close to no attack", ("multikrum",),
          lambda m: _like_no_attack(m, "omniscient", ["multikrum"], NEAR)),
    Claim("omniscient", "Krum slower (than MeaMed and Multi-Krum), but converges",
          ("krum", "meamed", "multikrum"), _krum_slower),
    Claim("omniscient", "GeoMed and MarMed converge to bad solutions", ("geomed", "marmed"),
          lambda m: _bad_solutions(m, ("geomed", "marmed"))),
    Claim("omniscient", "Mean and Medoid fail", ("mean", "medoid"),
          lambda m: _all(m, ["mean", "medoid"], lambda r: m.fails(r, "omniscient"),
                         "omniscient"),
          why_not="a hypothesis, not tested by a float32 run: our Medoid measures "
          "distances in float64 (`kernels.gram64`), so the omniscient vectors (1e20 x a sum "
          "of gradients, about 1e21 per value) are the farthest and never chosen; in "
          "float32 their squared distances would overflow to inf, every row would score "
          "inf, and the first row (Byzantine worker 0) would win the tie. Mean fails as "
          "reported."),
    Claim("bitflip", "only MarMed and MeaMed converge", PAPER,
          lambda m: _only(m, "bitflip", m.rules("bitflip", PAPER), {"marmed", "meamed"})),
    Claim("bitflip", "Krum-based rules stuck whatever q", KRUM_BASED,
          _krum_stuck_whatever_q),
    Claim("gambler", "only MarMed and MeaMed survive", PAPER,
          lambda m: _only(m, "gambler", m.rules("gambler", PAPER), {"marmed", "meamed"})),
    Claim("gambler", "MarMed and MeaMed slightly slower than Mean without attack",
          ("marmed", "meamed"),
          lambda m: _slower_but_close(m, ("marmed", "meamed"), "gambler")),
)


def judge(claim: Claim, m: Measures) -> Verdict:
    """The claim's verdict, or ``not run`` when the grid lacks a run it reads."""
    # every rule the claim reads in its scenario and without attack (the baselines)
    needed = list(dict.fromkeys(
        (r, s) for r in (*claim.rules, "mean") for s in (claim.scenario, "none")
        if r != "mean" or s == "none" or "mean" in claim.rules))
    if claim.check is not _krum_stuck_whatever_q and not all(m.has(*k) for k in needed):
        missing = ", ".join(f"{r}/{s}" for r, s in needed if not m.has(r, s))
        return Verdict(NOT_RUN, f"not run: {missing}")
    return claim.check(m)
