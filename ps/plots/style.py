"""One look for every figure the project draws: a non-interactive backend, one colour
and one marker per rule (the same in every figure), readable sizes, and how a figure is saved."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# tab10 order, fixed per rule so that a rule has one colour in every figure
RULE_COLOURS = {
    "mean": "#1f77b4",
    "medoid": "#8c564b",
    "krum": "#d62728",
    "multikrum": "#ff7f0e",
    "geomed": "#9467bd",
    "marmed": "#2ca02c",
    "meamed": "#17becf",
    "trimmed-mean": "#bcbd22",
    "bulyan": "#e377c2",
}
OTHER_COLOURS = ("#7f7f7f", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173")
# one marker per rule, so that lines of near colours (or printed in grey) stay apart
RULE_MARKERS = {"mean": "o", "medoid": "s", "krum": "^", "multikrum": "v", "geomed": "D",
                "marmed": "P", "meamed": "X", "trimmed-mean": "*", "bulyan": "h"}
OTHER_MARKERS = ("<", ">", "p", "d", "8", "H")
# a defence PRE+RULE: the rule's colour and marker, a line style per pre-aggregation
PRE_STYLES = {"": "-", "nnm": "--", "bucketing": ":"}
OTHER_PRE_STYLE = "-."
DPI = 110


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (files only; no display needed).

    matplotlib's own log lines below warnings (such as "generated new fontManager", on
    the first use with a fresh cache) are not the project's: they never reach the
    process's log, even with ``--verbose``."""
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": DPI, "axes.grid": True, "grid.alpha": 0.3,
                         "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 8})
    return plt


def rule_colour(rule: str) -> str:
    """The colour of ``rule`` in every figure (rules outside the table get a stable one)."""
    if rule in RULE_COLOURS:
        return RULE_COLOURS[rule]
    return OTHER_COLOURS[sum(rule.encode()) % len(OTHER_COLOURS)]


def rule_marker(rule: str) -> str:
    """The marker of ``rule`` in every figure (rules outside the table get a stable one)."""
    if rule in RULE_MARKERS:
        return RULE_MARKERS[rule]
    return OTHER_MARKERS[sum(rule.encode()) % len(OTHER_MARKERS)]


def line_style(name: str) -> dict[str, str]:
    """Matplotlib line keywords of a rule or a defence ``PRE+...+RULE``: the rule's
    colour and marker, a dashed (NNM), dotted (bucketing) or dash-dot line after a
    pre-aggregation chain."""
    *pre, rule = name.split("+")
    chain = "+".join(pre)
    return {"color": rule_colour(rule), "marker": rule_marker(rule),
            "linestyle": PRE_STYLES.get(chain, OTHER_PRE_STYLE)}


def save(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as a PNG at ``path`` (atomically) and close it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=DPI, bbox_inches="tight")
    os.replace(tmp, path)
    pyplot().close(fig)
    return path
