"""Refresh the tables of ``docs/results.md`` from the published reports.

``docs/results.md`` quotes the tables of ``docs/results/<grid>/report.md`` (a test checks
that every row it shows is a report's). After a grid grows (more seeds, a new sweep) and
its report is rebuilt (``ps-experiment report docs/results/<grid>``), this replaces each
table of the page by the report table with the same header whose rows share the most
first cells with it, and names the tables it found no match for (edit those by hand).

    python3 scripts/sync_results_tables.py            # rewrite docs/results.md
    python3 scripts/sync_results_tables.py --check    # exit 1 if a table is stale
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results.md"
REPORTS = ROOT / "docs" / "results"

Table = list[str]  # its lines, header first


def tables(lines: list[str]) -> list[tuple[int, int]]:
    """(first, end) line ranges of the markdown tables of ``lines``."""
    found, start = [], None
    for i, line in enumerate([*lines, ""]):
        if line.startswith("|") and start is None:
            start = i
        elif not line.startswith("|") and start is not None:
            found.append((start, i))
            start = None
    return found


def _first_cells(table: Table) -> set[str]:
    return {row.split("|")[1].strip() for row in table[2:] if row.count("|") > 1}


def best_match(table: Table, candidates: list[Table]) -> Table | None:
    """The candidate with ``table``'s header that shares the most first cells with it,
    and of those (tables of one report alike but for a panel) the most whole rows."""
    same = [c for c in candidates if c[0] == table[0]]
    if not same:
        return None
    return max(same, key=lambda c: (len(_first_cells(c) & _first_cells(table)),
                                    len(set(c[2:]) & set(table[2:]))))


def published_tables() -> list[Table]:
    out = []
    for report in sorted(REPORTS.glob("*/report.md")):
        lines = report.read_text(encoding="utf-8").splitlines()
        out += [lines[a:b] for a, b in tables(lines)]
    return out


@click.command()
@click.option("--check", is_flag=True, help="Only say whether a table is stale (exit 1).")
def main(check: bool) -> None:
    """Replace each table of docs/results.md by its published report's."""
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    candidates = published_tables()
    out, last, stale, unmatched = [], 0, 0, []
    for start, end in tables(lines):
        table = lines[start:end]
        match = best_match(table, candidates)
        out += lines[last:start]
        if match is None:
            unmatched.append(f"line {start + 1}: {table[0]}")
            match = table
        stale += match != table
        out += match
        last = end
    out += lines[last:]
    for line in unmatched:
        click.echo(f"no report table with this header: {line}", err=True)
    if check:
        click.echo(f"{stale} stale table(s)")
        sys.exit(1 if stale else 0)
    PAGE.write_text("\n".join(out) + "\n", encoding="utf-8")
    click.echo(f"{stale} table(s) refreshed; {len(unmatched)} without a match")


if __name__ == "__main__":
    main()
