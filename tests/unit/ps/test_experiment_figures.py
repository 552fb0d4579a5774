"""The grids' figures: a chance line from the dataset's classes, lines told apart by
colour, marker and line style, captions and titles computed from the runs."""

from __future__ import annotations

import pytest

from ps.experiments import figures
from ps.experiments.figures import chance, draw_scenario, run_caption, scenario_title
from ps.experiments.grid import PAPER_RULES, GridSpec, paper_cells
from ps.experiments.modern import MODERN_DEFENCES
from ps.plots.style import line_style, pyplot


def _run(rule: str, scenario: str, seed: int, n: int = 7, f: int = 2) -> dict:
    return {"rule": rule, "scenario": scenario, "seed": seed, "rounds": 4,
            "dataset": "synthetic", "num_workers": n, "num_byzantine": f, "num_shards": 4,
            "points": [{"round": t, "top1": 0.1 + 0.2 * t, "top3": 0.9} for t in (0, 2, 4)]}


def test_chance_is_k_over_the_classes_of_the_dataset(monkeypatch: pytest.MonkeyPatch) -> None:
    assert chance([_run("mean", "none", 0)], "top1") == pytest.approx(0.1)  # 10 classes
    monkeypatch.setattr(figures, "dataset_shape", lambda name: ((1, 2, 2), 4))
    assert chance([_run("mean", "none", 0)], "top1") == pytest.approx(0.25)
    assert chance([_run("mean", "none", 0)], "top3") == pytest.approx(0.75)


def test_a_scenario_panel_has_a_chance_line_and_a_marker_per_rule() -> None:
    plt = pyplot()
    fig, (full, zoom) = plt.subplots(1, 2)
    runs = [_run(rule, "gaussian", s) for rule in ("mean", "krum", "marmed") for s in (0, 1)]
    draw_scenario(full, zoom, runs, "gaussian", "top1", ["mean", "krum", "marmed"])
    lines = {line.get_label(): line for line in full.get_lines()}
    assert "chance (0.10)" in lines and lines["chance (0.10)"].get_ydata()[0] == 0.1
    markers = [lines[r].get_marker() for r in ("mean", "krum", "marmed")]
    assert len(set(markers)) == 3 and "None" not in markers
    assert full.get_title() == "Gaussian (2 of 7 workers, sd 200)"
    assert zoom.get_xlim()[0] > 0  # the zoom starts after the first rounds
    plt.close(fig)


def test_an_attack_panel_shows_mean_without_attack_and_a_zoom_holding_every_learner(
        ) -> None:
    plt = pyplot()
    fig, (full, zoom) = plt.subplots(1, 2)
    runs = [_run("mean", "none", s) for s in (0, 1)]
    for rule, final in (("krum", 0.62), ("marmed", 0.9), ("mean", 0.1)):
        runs += [{**_run(rule, "omniscient", s),
                  "points": [{"round": t, "top1": final} for t in (0, 2, 4)]} for s in (0, 1)]
    draw_scenario(full, zoom, runs, "omniscient", "top1", ["mean", "krum", "marmed"])
    assert "mean, no attack" in [line.get_label() for line in full.get_lines()]
    low, high = zoom.get_ylim()
    assert low <= 0.6 and high >= 0.9  # krum, far below marmed, is still in the zoom
    assert low > 0.1  # mean failed: at chance, in the full panel only
    plt.close(fig)


def test_every_rule_and_defence_has_its_own_line() -> None:
    styles = [tuple(sorted(line_style(d).items())) for d in (*PAPER_RULES, *MODERN_DEFENCES)]
    assert len(set(styles)) == len(set(PAPER_RULES + MODERN_DEFENCES))
    nnm, alone = line_style("nnm+krum"), line_style("krum")
    assert nnm["color"] == alone["color"] and nnm["linestyle"] != alone["linestyle"]


def test_captions_and_titles_come_from_the_runs() -> None:
    runs = [_run("mean", "none", s, f=0) for s in (0, 1, 2)] + [_run("mean", "gaussian", 0)]
    assert run_caption(runs) == "synthetic; n = 7, f = 2 (gaussian), S = 4; 4 rounds; 3 seed(s)"
    assert "no Byzantine workers" in run_caption(runs[:3])  # a proxy attack's, or none
    assert scenario_title("omniscient", [_run("mean", "omniscient", 0, n=20, f=6)]) \
        == "omniscient (6 of 20 workers, -1e20 × sum)"
    assert scenario_title("gambler", [{**_run("mean", "gambler", 0), "num_shards": 20}]) \
        .startswith("gambler (20 servers")


def test_a_cell_records_its_n_f_and_s() -> None:
    cells = paper_cells(GridSpec(dataset="synthetic", rounds=4, seeds=1, num_workers=7,
                                 rules=("mean",), sweeps=False))
    tags = {c.scenario: c.tags() for c in cells}
    assert tags["none"]["num_byzantine"] == 0 and tags["gaussian"]["num_byzantine"] == 2
    assert tags["gaussian"]["num_workers"] == 7 and tags["gambler"]["num_shards"] == 20


def test_the_sweeps_draw_a_panel_per_attack_and_every_rules_gap_to_mean(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    saved: dict[str, object] = {}
    monkeypatch.setattr(figures, "save", lambda fig, path: saved.setdefault(path.name, fig)
                        and path)
    q_runs = [{**_run(rule, scenario, s), "figure": "q-sweep", "q": q}
              for scenario in ("bitflip", "gambler") for rule in ("krum", "meamed")
              for q in (2, 8) for s in (0, 1)]
    batch_runs = [{**_run(rule, "none", s), "figure": "batch-sweep", "batch_size": b}
                  for rule in ("mean", "krum") for b in (8, 128) for s in (0, 1)]
    figures.q_sweep_figure(tmp_path, q_runs, "top1")
    figures.batch_sweep_figure(tmp_path, batch_runs, "top1")
    q_axes = saved["q-sweep.png"].axes  # type: ignore[attr-defined]
    assert [a.get_title().split(" under ")[1].split(" ")[0] for a in q_axes] == [
        "bit-flip", "gambler"]
    finals, gaps = saved["batch-sweep.png"].axes  # type: ignore[attr-defined]
    assert {t.get_text() for t in finals.get_legend().get_texts()} >= {"mean", "krum"}
    assert [t.get_text() for t in gaps.get_legend().get_texts()] == ["krum"]
