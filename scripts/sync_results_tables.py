"""Refresh the tables of ``docs/results.md`` from the published reports
(``ps/experiments/pagetables.py``): after a grid grows and its report is rebuilt
(``ps-experiment report docs/results/<grid>``), each table of the page becomes the report
table with its header that shares the most first cells, values and rows with it; tables
without one, or with two that fit equally, are named (edit those by hand).

    python3 scripts/sync_results_tables.py            # rewrite docs/results.md
    python3 scripts/sync_results_tables.py --check    # exit 1 if a table is stale
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ps.experiments.pagetables import report_tables, sync  # noqa: E402

PAGE = ROOT / "docs" / "results.md"
REPORTS = ROOT / "docs" / "results"


@click.command()
@click.option("--check", is_flag=True, help="Only say whether a table is stale (exit 1).")
def main(check: bool) -> None:
    """Replace each table of docs/results.md by its published report's."""
    synced = sync(PAGE.read_text(encoding="utf-8"), report_tables(REPORTS))
    for line in synced.unmatched:
        click.echo(f"no report table with this header, or two that fit it equally: {line}",
                   err=True)
    if check:
        click.echo(f"{synced.stale} stale table(s)")
        sys.exit(1 if synced.stale else 0)
    PAGE.write_text(synced.text, encoding="utf-8")
    click.echo(f"{synced.stale} table(s) refreshed; {len(synced.unmatched)} without a match")


if __name__ == "__main__":
    main()
