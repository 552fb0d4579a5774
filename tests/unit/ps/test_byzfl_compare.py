"""The comparison with ByzFL (``ps/experiments/byzfl.py``) without ByzFL: the pairs name
only our registered rules, pre-aggregators and attacks, with settings they accept; the
rounding verdict refuses outputs that differ; the ALIE mapping; the ``byzfl-*`` rules
exist only while registered; the report's tables. The last test runs ByzFL itself and is
skipped where byzfl is not installed (CI does not install it)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from common.learn.attacks import attack_class
from common.learn.attacks.alie import alie, alie_z
from common.learn.rules import RuleError, rule_class
from common.learn.rules.pre import pre_class
from ps.experiments.byzfl import (
    BACKENDS,
    CELLS,
    INPUTS,
    NOTES,
    PAIRS,
    N,
    alie_tau,
    cell_verdict,
    compare_case,
    load_byzfl,
    make_inputs,
    registered,
    report,
    verdict,
    within_rounding,
)
from ps.experiments.claims import Sample

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: p.label)
def test_each_pair_names_one_of_ours_with_settings_it_accepts(pair) -> None:
    assert set(pair.inputs) <= set(INPUTS)
    for f in pair.fs:
        if pair.kind == "rule":
            rule_class(pair.ours).check(N, pair.q(f), **pair.ours_options(f))
        elif pair.kind == "pre":
            pre_class(pair.ours).check(N, pair.q(f), **pair.ours_options(f))
        else:
            attack_class(pair.ours)(**pair.ours_options(f)).check(N, f)
        if pair.check == "search":
            rule_class(pair.target[0]).check(N, f)


def test_every_pair_is_explained_and_every_note_names_a_pair() -> None:
    labels = {pair.label for pair in PAIRS}
    assert len(labels) == len(PAIRS)
    assert labels <= set(NOTES)
    for key in NOTES:
        label, _, inputs = key.partition(" [")
        assert label in labels and inputs.rstrip("]") in ("", *INPUTS)


def test_every_cell_pairs_one_of_our_rules() -> None:
    for ours, _, _, _ in CELLS:
        rule_class(ours)


def test_rounding_verdict_passes_rounding_and_refuses_differences() -> None:
    a = np.linspace(-3, 3, 50, dtype=np.float32)
    scale = np.ones(50)
    assert within_rounding(a, a.copy(), scale) == (0.0, True)
    ulp = np.nextafter(a, np.float32(np.inf))
    assert within_rounding(a, ulp, scale)[1]
    diff, close = within_rounding(a, a + np.float32(1e-3), scale)
    assert not close and diff == pytest.approx(1e-3, rel=1e-2)
    assert within_rounding(a * 1000, a * 1000 + np.float32(1e-3), scale * 1000)[1]
    assert within_rounding(a, a[:-1], scale) == (float("inf"), False)


def test_rounding_verdict_needs_the_same_nan_and_infinities() -> None:
    a = np.zeros(4, dtype=np.float32)
    scale = np.ones(4)
    for value in (np.nan, np.inf):
        b = a.copy()
        b[1] = value
        assert not within_rounding(a, b, scale)[1]
        assert within_rounding(b, b.copy(), scale)[1]
    b, c = a.copy(), a.copy()
    b[0], c[0] = np.inf, -np.inf
    assert not within_rounding(b, c, scale)[1]


def test_verdict_counts() -> None:
    assert verdict(6, 6) == "agree"
    assert verdict(0, 6) == "differ"
    assert verdict(4, 6) == "agree in 4/6"


def test_alie_tau_forges_what_our_alie_forges() -> None:
    f = 4
    honest = make_inputs("clean", 0, f)[0][f:]
    z = alie_z(N, f)
    ours = alie(honest, f, np.random.default_rng(0), z=z)[0]
    data = honest.astype(np.float64)
    theirs = data.mean(axis=0) + alie_tau(z, N - f) * data.std(axis=0, ddof=1)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)


def test_inputs_are_reproducible_with_the_first_f_rows_forged() -> None:
    rows, forged = make_inputs("omniscient", 1, 4)
    assert rows.shape == (N, 1000) and rows.dtype == np.float32 and forged == 4
    assert np.abs(rows[:4]).min() > 1e15 and np.abs(rows[4:]).max() < 20
    np.testing.assert_array_equal(rows, make_inputs("omniscient", 1, 4)[0])
    assert make_inputs("clean", 1, 4)[1] == 0


def test_byzfl_rules_exist_only_while_registered() -> None:
    names = [name for _, name, _, _ in CELLS]
    for name in names:
        with pytest.raises(RuleError):
            rule_class(name)
    with registered():
        for name in names:
            rule_class(name)
        with pytest.raises(RuleError, match="2q < n"):
            rule_class("byzfl-krum").check(N, 10)
        rule_class("byzfl-median").check(N, 10)
    for name in names:
        with pytest.raises(RuleError):
            rule_class(name)


def _cells(ours: list[float], theirs: list[float]) -> list[dict[str, object]]:
    """Training records of the marmed pair (ByzFL's seed 0 bit-identical to ours)."""
    return ([{"rule": "marmed", "seed": s, "top1": v, "params_sha256": f"a{s}"}
             for s, v in enumerate(ours)]
            + [{"rule": "byzfl-median", "seed": s, "top1": v,
                "params_sha256": "a0" if s == 0 else "b"} for s, v in enumerate(theirs)])


def test_report_tables() -> None:
    row = {"pair": "mean / Average()", "ours": "mean", "theirs": "Average()",
           "inputs": "clean", "verdict": "agree", "max_abs_diff": {b: 0.0 for b in BACKENDS}}
    result = {"byzfl": "0.0.11", "imported": "import byzfl", "torch": "2", "numpy": "2",
              "n": N, "d": 1000, "fs": [2], "seeds": 1, "tolerance": "t", "rows": [row],
              "minutes": 12.5,
              "cell_spec": {"attack": "alie", "q": 6, "rounds": 100, "seeds": 3,
                            "tolerance": 0.02},
              "cells": _cells([0.80, 0.81, 0.82], [0.80, 0.81, 0.825])}
    text = report(result, "python3 scripts/compare_byzfl.py")
    assert "| mean | Average() | clean | 0 | 0 | agree |" in text
    assert "`python3 scripts/compare_byzfl.py` (12.5 min of wall time here" in text
    assert ("| marmed | 0.810 ± 0.025 | byzfl-median | 0.812 ± 0.031 | -0.002 "
            "[-0.009, +0.006] | alike (within ±0.02) | 1/3 |") in text
    assert "| krum | nan (0 seeds) | byzfl-krum |" in text  # a pair not run is shown so


@pytest.mark.parametrize(("ours", "theirs", "verdict"), [
    ([0.80, 0.81, 0.82], [0.80, 0.81, 0.825], "alike (within ±0.02)"),
    ([0.80, 0.81, 0.82], [0.80, 0.80, 0.83], "inconclusive"),  # ±0.025: past the bound
    ([0.80, 0.81, 0.82], [0.70, 0.72, 0.71], "ours higher"),
    ([0.70, 0.72, 0.71], [0.80, 0.81, 0.82], "ours lower"),
    ([0.800, 0.810, 0.820], [0.795, 0.806, 0.814], "ours higher, alike (within ±0.02)"),
    ([0.60, 0.80, 0.70], [0.80, 0.60, 0.70], "inconclusive"),
])
def test_cell_verdicts(ours: list[float], theirs: list[float], verdict: str) -> None:
    assert cell_verdict(Sample.of(ours), Sample.of(theirs), 0.02) == verdict


def test_the_published_report_is_its_results() -> None:
    """docs/results/byzfl/report.md is what its agreement.json gives, every seed of the
    training cells paired."""
    folder = ROOT / "docs" / "results" / "byzfl"
    result = json.loads((folder / "agreement.json").read_text(encoding="utf-8"))
    assert (folder / "report.md").read_text(encoding="utf-8") == report(result,
                                                                         result["command"])
    spec = result["cell_spec"]
    assert len(result["cells"]) == 2 * len(CELLS) * spec["seeds"]


@pytest.mark.skipif(importlib.util.find_spec("byzfl") is None, reason="byzfl not installed")
def test_trimmed_mean_agrees_with_byzfl() -> None:
    pair = next(p for p in PAIRS if p.ours == "trimmed-mean")
    byz = load_byzfl()
    for backend in BACKENDS:
        assert compare_case(pair, byz, "omniscient", 0, 4, backend)["agree"]
