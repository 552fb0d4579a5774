"""Whether a cell's accuracy curve has flattened by its last round, and the grid-file
report's count of the cells that have.

The criterion, on the curve averaged over seeds first (the curve a cell's mean final
stands for): over the last third of the run (1 / ``LAST``; at least its last
``MIN_POINTS`` evaluations), fit a least-squares line to the evaluations. The curve is
*flat* when that line moves by less than ``DRIFT`` (0.01) per tenth of the run, so it
no longer climbs or falls (on a straight line: the mean over the last 10 % of the
rounds within 0.01 of the mean over the 10 % before), and no evaluation lies ``SWING`` (0.02,
``claims.CLOSE``: the spread of a rule's finals over seeds) or more from the line, so
it no longer oscillates. A line through the window, not the last two evaluations, so
that one noisy evaluation neither passes nor fails a curve; a diverged one (NaN) is
not flat.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ps.experiments.claims import CLOSE

LAST = 3  # the line is fitted over the last 1 / LAST of the rounds
MIN_POINTS = 3  # evaluations in the window: the last 3 where it holds fewer
DRIFT = 0.01  # the most the line may move per tenth of the run
SWING = CLOSE  # the farthest an evaluation may lie from the line

Runs = list[dict[str, Any]]


@dataclass(frozen=True)
class Flatness:
    """A curve's end: the fitted line's change per tenth of the run, and the largest
    distance of an evaluation from it (NaN where a value is not finite)."""

    drift: float
    swing: float
    rounds: tuple[int, ...]  # the evaluations fitted

    @property
    def drifting(self) -> bool:
        return not abs(self.drift) < DRIFT

    @property
    def swinging(self) -> bool:
        return not self.swing < SWING

    @property
    def flat(self) -> bool:
        return not (self.drifting or self.swinging)


def flatness(rounds: Sequence[int], values: Sequence[float], total: int) -> Flatness | None:
    """The end of the curve ``values`` at ``rounds`` (rising) of a ``total``-round run;
    None with fewer than ``MIN_POINTS`` evaluations."""
    if len(rounds) < MIN_POINTS:
        return None
    start = min(total - total / LAST, rounds[-MIN_POINTS])
    kept = [(t, float(v)) for t, v in zip(rounds, values, strict=True) if t >= start]
    fitted = tuple(t for t, _ in kept)
    if not all(math.isfinite(v) for _, v in kept):
        return Flatness(math.nan, math.nan, fitted)
    mx, my = statistics.fmean(fitted), statistics.fmean(v for _, v in kept)
    slope = sum((t - mx) * (v - my) for t, v in kept) / sum((t - mx) ** 2 for t in fitted)
    swing = max(abs(v - my - slope * (t - mx)) for t, v in kept)
    return Flatness(slope * total / 10, swing, fitted)


def _value(point: dict[str, Any], metric: str) -> float:
    value = point.get(metric)
    return float(value) if value is not None else math.nan


def seed_curve(runs: Runs, metric: str) -> tuple[list[int], list[float]]:
    """The rounds every run of ``runs`` (a cell's seeds) evaluated, and the mean over
    the seeds at each."""
    by_round: dict[int, list[float]] = defaultdict(list)
    for r in runs:
        for p in r["points"]:
            by_round[p["round"]].append(_value(p, metric))
    rounds = sorted(t for t, v in by_round.items() if len(v) == len(runs))
    return rounds, [statistics.fmean(by_round[t]) for t in rounds]


def cell_flatness(runs: Runs, metric: str) -> Flatness | None:
    """A cell's flatness: its seeds' mean curve's."""
    rounds, values = seed_curve(runs, metric)
    return flatness(rounds, values, max(r["rounds"] for r in runs))


def every_seed_flat(runs: Runs, metric: str) -> bool:
    """Whether each seed's own curve is flat."""
    ends = [flatness([p["round"] for p in r["points"]],
                     [_value(p, metric) for p in r["points"]], r["rounds"]) for r in runs]
    return all(e is not None and e.flat for e in ends)


def flatness_lines(cells: dict[tuple[str, ...], Runs], axes: tuple[str, ...], counted_by: int,
                   metric: str, measure: str) -> list[str]:
    """Markdown: the criterion, how many ``cells`` (their values on ``axes``: their runs,
    one per seed) are flat, counted by the first ``counted_by`` axes, and those that are
    not, with their drift and swing; nothing if no cell has enough evaluations."""
    ends = {key: cell_flatness(cells[key], metric) for key in _ordered(list(cells))}
    judged = {key: end for key, end in ends.items() if end is not None}
    if not judged:
        return []
    windows = list(dict.fromkeys(end.rounds for end in judged.values()))
    here = f"; here rounds {', '.join(map(str, windows[0]))}" if len(windows) == 1 else ""
    lines = ["", f"## Flatness at the last round: {measure}", "",
             f"A cell is *flat* when its curve, the {measure} of each evaluation averaged "
             f"over seeds, has stopped moving over the last third of the run (at least its "
             f"last {MIN_POINTS} evaluations{here}): the "
             f"least-squares line through those evaluations moves by less than {DRIFT:g} "
             f"per tenth of the run (else *drifting*: still climbing or falling) and no "
             f"evaluation lies {SWING:g} or more from it (else *swinging*: oscillating; "
             f"{SWING:g} is the spread of a rule's finals over seeds); a cell may be both. "
             "*Flat on every seed*: each seed's own curve passes the same test."]
    if len(judged) < len(ends):
        lines += ["", f"{len(ends) - len(judged)} cells with fewer than {MIN_POINTS} "
                      "evaluations are not judged."]
    lines += _count_table(cells, judged, axes[:counted_by], metric)
    lines += _not_flat(judged, axes)
    return lines


def _ordered(keys: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """``keys`` sorted axis by axis, each axis's values in the order they first come."""
    ranks = [{v: i for i, v in enumerate(dict.fromkeys(k[n] for k in keys))}
             for n in range(len(keys[0]) if keys else 0)]
    return sorted(keys, key=lambda k: [rank[v] for rank, v in zip(ranks, k, strict=True)])


def _count_table(cells: dict[tuple[str, ...], Runs], judged: dict[tuple[str, ...], Flatness],
                 by: tuple[str, ...], metric: str) -> list[str]:
    """Per value of the axes ``by``: how many cells, flat, drifting, swinging, flat on
    every seed, and the median drift (how fast the curves still move)."""
    counts: dict[tuple[str, ...], Counter[str]] = defaultdict(Counter)
    drifts: dict[tuple[str, ...], list[float]] = defaultdict(list)
    for key, end in judged.items():
        counts[key[:len(by)]].update(cells=1, flat=int(end.flat), drifting=int(end.drifting),
                                     swinging=int(end.swinging),
                                     seeds=int(every_seed_flat(cells[key], metric)))
        drifts[key[:len(by)]].append(end.drift)
    names = list(by) or ["grid"]
    lines = ["", "| " + " | ".join(names) + " | cells | flat | drifting | swinging | "
             "flat on every seed | median drift |", "|" + "---|" * (len(names) + 6)]
    for group, count in counts.items():
        numbers = [str(count[k]) for k in ("cells", "flat", "drifting", "swinging", "seeds")]
        finite = [d for d in drifts[group] if math.isfinite(d)]
        median = f"{statistics.median(finite):+.3f}" if finite else "-"
        lines.append("| " + " | ".join([*(group or ("all",)), *numbers, median]) + " |")
    return lines


def _not_flat(judged: dict[tuple[str, ...], Flatness], axes: tuple[str, ...]) -> list[str]:
    """One line per value of all axes but the last: the cells there that are not flat."""
    grouped: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for key, end in judged.items():
        if not end.flat:
            *place, last = key or ("all",)
            grouped[tuple(place)].append(f"{last} ({end.drift:+.3f}, {end.swing:.3f})")
    if not grouped:
        return ["", "Every cell is flat."]
    lines = ["", f"Not flat, by {axes[-1] if axes else 'cell'} (drift per tenth of the run, "
             "swing):", ""]
    for where, found in grouped.items():
        named = ", ".join(f"{a} = {v}" for a, v in zip(axes, where, strict=False))
        lines.append(f"* {named or 'all'}: {', '.join(found)}")
    return lines
