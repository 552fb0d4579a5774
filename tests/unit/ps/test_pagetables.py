"""The results page's tables kept equal to the reports' (``ps/experiments/pagetables.py``,
``scripts/sync_results_tables.py``): the match by header, then first cells, values
and rows, a stale table replaced, an unknown header or a tie named, and the published
page in sync."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ps.experiments.pagetables import best_match, report_tables, sync, tables

ROOT = Path(__file__).resolve().parents[3]
HEADER = ["| rule | top-1 |", "|---|---|"]
PANEL_0 = [*HEADER, "| mean | 0.80 |", "| krum | 0.70 |"]
PANEL_9 = [*HEADER, "| mean | 0.81 |", "| krum | 0.60 |"]
OTHER = [*HEADER, "| geomed | 0.75 |"]


def test_tables_are_the_runs_of_lines_that_start_with_a_bar() -> None:
    lines = ["text", *PANEL_0, "", "more", *OTHER]
    assert tables(lines) == [(1, 5), (7, 10)]
    assert tables(["| a |"]) == [(0, 1)]


def test_the_match_has_the_header_then_the_most_first_cells_then_the_most_rows() -> None:
    assert best_match(["| other | header |", "|---|"], [PANEL_0]) is None
    stale = [*HEADER, "| mean | 0.79 |", "| krum | 0.60 |"]  # panel 9's krum row
    assert best_match(stale, [OTHER, PANEL_0, PANEL_9]) == PANEL_9
    assert best_match([*HEADER, "| geomed | 0.1 |"], [PANEL_0, OTHER]) == OTHER


def test_when_every_row_changed_its_brackets_the_values_decide() -> None:
    """A report rebuilt with fewer ties changes every row of both panels: the page's
    momentum-0 table still goes to momentum 0's, by its values before the brackets."""
    beta_9 = [*HEADER, "| mean | 0.81 (alie) |", "| krum | 0.60 (ipm) |"]
    beta_0 = [*HEADER, "| mean | 0.80 (alie) |", "| krum | 0.70 (alie) |"]
    page_0 = [*HEADER, "| mean | 0.80 (alie; ~ none) |", "| krum | 0.70 (alie; ~ none) |"]
    assert best_match(page_0, [beta_9, beta_0]) == beta_0


def test_two_different_best_matches_are_named_not_guessed(tmp_path: Path) -> None:
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "report.md").write_text(
        "\n".join(["# r", *PANEL_0, "", *PANEL_9]) + "\n", encoding="utf-8")
    unlike_both = [*HEADER, "| mean | 0.5 |", "| krum | 0.5 |"]
    assert best_match(unlike_both, [PANEL_0, PANEL_9]) is None
    assert best_match(unlike_both, [PANEL_0, list(PANEL_0)]) == PANEL_0  # one table twice
    assert best_match(unlike_both, [PANEL_0, list(PANEL_0), PANEL_9]) is None
    synced = sync("\n".join(["# page", *unlike_both]), report_tables(tmp_path))
    assert synced.unmatched == ["line 2: | rule | top-1 |"] and synced.stale == 0


def test_sync_replaces_a_stale_table_and_names_an_unknown_one(tmp_path: Path) -> None:
    (tmp_path / "paper").mkdir()
    (tmp_path / "paper" / "report.md").write_text(
        "\n".join(["# r", *PANEL_0, "", *OTHER]) + "\n", encoding="utf-8")
    page = "\n".join(["# page", "", *HEADER, "| mean | 0.5 |", "| krum | 0.70 |", "",
                      "| unknown |", "|---|", "| x |", "", "end"])
    synced = sync(page, report_tables(tmp_path))
    assert synced.stale == 1 and synced.unmatched == ["line 8: | unknown |"]
    assert synced.text.splitlines()[2:6] == PANEL_0
    assert "| x |" in synced.text and synced.text.endswith("end\n")
    again = sync(synced.text, report_tables(tmp_path))
    assert again.stale == 0 and again.text == synced.text


def test_the_published_page_is_in_sync_with_its_reports() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "sync_results_tables.py"),
                           "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 stale table(s)" in done.stdout
