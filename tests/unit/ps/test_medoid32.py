"""The float32 Medoid of the float32 hypothesis (``ps/experiments/medoid32.py``): with
ordinary rows it picks what our Medoid picks; with the omniscient attack's rows its
distances overflow and it picks the first row, where ours picks an honest one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.learn.rules import RuleError, make_rule, rule_class
from ps.experiments.medoid32 import RULE, Float32Medoid, registered


def _rows(forged: int = 0) -> np.ndarray:
    rng = np.random.default_rng(3)
    honest = rng.normal(size=(20, 50)).astype(np.float32)
    honest[:forged] = -1e20 * honest[forged:].sum(axis=0)  # the omniscient attack's rows
    return honest


def test_with_ordinary_rows_it_picks_what_our_medoid_picks() -> None:
    G = torch.from_numpy(_rows())
    ours, naive = make_rule("medoid", 20, 8), Float32Medoid(20, 8)
    np.testing.assert_array_equal(np.asarray(ours(G)), np.asarray(naive(G)))
    assert naive.last_info["selected"] == ours.last_info["selected"]


def test_with_the_omniscient_rows_float32_picks_the_first_forged_row() -> None:
    G = torch.from_numpy(_rows(forged=6))
    ours, naive = make_rule("medoid", 20, 8), Float32Medoid(20, 8)
    ours(G)
    naive(G)
    assert ours.last_info["selected"][0] >= 6  # an honest row (float64 distances)
    assert naive.last_info["selected"] == [0]


def test_it_is_a_rule_only_while_registered() -> None:
    with pytest.raises(RuleError):
        rule_class(RULE)
    with registered():
        assert rule_class(RULE) is Float32Medoid
    with pytest.raises(RuleError):
        rule_class(RULE)


def test_the_report_tables_every_run(tmp_path) -> None:
    import json

    from ps.experiments.medoid32 import write_report

    runs = [{"rule": r, "seed": s, "top1": t, "forged_selected": f, "selections": 8}
            for s in (0, 1) for r, t, f in (("medoid", 0.8, 0), (RULE, 0.1, 8))]
    (tmp_path / "medoid-float32.json").write_text(json.dumps({"rounds": 2, "runs": runs}))
    text = write_report(tmp_path).read_text()
    assert "| medoid-float32 | 1 | 0.1000 | 8 / 8 |" in text and "--seeds 2" in text
