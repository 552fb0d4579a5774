"""``ps-experiment compare``: two published grids' worst cases paired by seed, cell by
cell (``ps/experiments/compare.py``), on the published heterogeneity folders."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from common.errors import ConfigError
from ps.experiments.cli import main
from ps.experiments.compare import compare_lines, read_side

RESULTS = Path(__file__).resolve().parents[3] / "docs" / "results"
LONG, DECAY = RESULTS / "heterogeneity-long", RESULTS / "heterogeneity-decay"


def _row(lines: list[str], defence: str) -> str:
    return next(line for line in lines if line.startswith(f"| {defence} |"))


def test_the_step_down_beside_the_constant_rate_pairs_each_cells_worst_case_by_seed() -> None:
    """Centered clipping's worst case on the extreme split: 0.309 at 400 rounds of the
    constant rate, 0.557 at 300 with the rate divided by 10 at 150, +0.248 paired by
    seed (the three seeds' worst attacks differ between the two)."""
    lines = compare_lines(read_side(LONG), read_side(DECAY))
    assert lines[0] == ("# Worst cases over worker-attack: heterogeneity-decay beside "
                        "heterogeneity-long")
    assert _row(lines, "centered-clipping").endswith(
        "| 0.309 → 0.557, +0.248 [+0.175, +0.321] |")
    assert _row(lines, "mean").startswith("| mean | 0.174 → 0.323, +0.149 [+0.077, +0.220] |")


def test_the_published_comparison_is_what_the_command_gives_now(monkeypatch) -> None:
    """docs/results/heterogeneity-decay/beside-constant-rate.md, which docs/results.md
    quotes, is the output of its command on the published results."""
    monkeypatch.chdir(RESULTS.parents[1])
    lines = compare_lines(read_side(Path("docs/results/heterogeneity-long")),
                          read_side(Path("docs/results/heterogeneity-decay")))
    published = DECAY / "beside-constant-rate.md"
    assert published.read_text(encoding="utf-8") == "\n".join(lines) + "\n", (
        "stale: ps-experiment compare docs/results/heterogeneity-long "
        "docs/results/heterogeneity-decay --out " + str(published.relative_to(Path.cwd())))


def test_one_grid_against_itself_at_an_earlier_round_is_its_reports_round_table() -> None:
    """The decay grid at round 150 beside its end: the entries of its report's
    ``at_rounds`` table, computed the same way."""
    lines = compare_lines(read_side(DECAY, 150), read_side(DECAY))
    report = (DECAY / "report.md").read_text(encoding="utf-8").splitlines()
    start = report.index("## Worst case over worker-attack at round 150 and at the end: "
                         "test top1")
    for defence in ("mean", "centered-clipping", "bucketing+geomed"):
        assert _row(lines, defence) == _row(report[start:], defence)


def test_grids_that_do_not_pair_are_refused_naming_why(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(DECAY / "results.jsonl.gz", other)
    grid = json.loads((DECAY / "grid.json").read_text(encoding="utf-8"))
    grid["report"]["columns"] = "partition"
    (other / "grid.json").write_text(json.dumps(grid), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"\[report\] differ in columns"):
        compare_lines(read_side(LONG), read_side(other))
    with pytest.raises(ConfigError, match="no run was evaluated at round 151"):
        read_side(DECAY, 151)
    with pytest.raises(ConfigError, match="not a grid file's results with a \\[report\\]"):
        read_side(RESULTS / "paper")
    with pytest.raises(ConfigError, match=r"no grid\.json"):
        read_side(tmp_path)


def test_the_command_writes_the_tables_or_says_why_not(tmp_path: Path) -> None:
    out = tmp_path / "beside.md"
    done = CliRunner().invoke(main, ["compare", str(LONG), str(DECAY), "--round-before",
                                     "400", "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert done.output == f"compared: {out}\n"
    text = out.read_text(encoding="utf-8")
    assert "at round 400" in text and "| 0.309 → 0.557, +0.248 [+0.175, +0.321] |" in text
    refused = CliRunner().invoke(main, ["compare", str(LONG), str(DECAY),
                                        "--round-after", "7"])
    assert refused.exit_code != 0 and "no run was evaluated at round 7" in refused.output
