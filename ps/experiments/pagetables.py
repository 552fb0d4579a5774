"""The tables a results page quotes, kept equal to the published reports' tables.

``docs/results.md`` quotes tables of ``docs/results/<grid>/report.md`` (a test checks that
every row it shows is a report's). After a grid grows and its report is rebuilt, each
table of the page is replaced by the report table with the same header whose rows share
the most first cells with it (then the most whole rows); a table whose header no report
has is named, to be edited by hand (``scripts/sync_results_tables.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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


def report_tables(reports: Path) -> list[Table]:
    """Every table of every ``reports/*/report.md``."""
    out = []
    for report in sorted(reports.glob("*/report.md")):
        lines = report.read_text(encoding="utf-8").splitlines()
        out += [lines[a:b] for a, b in tables(lines)]
    return out


@dataclass(frozen=True)
class Synced:
    """A page with its tables replaced: its text, how many tables changed, and the
    headers (with their line) no report table has."""

    text: str
    stale: int
    unmatched: list[str]


def sync(page: str, candidates: list[Table]) -> Synced:
    """``page`` with each table replaced by its best match among ``candidates``."""
    lines = page.splitlines()
    out: list[str] = []
    last, stale, unmatched = 0, 0, []
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
    return Synced("\n".join(out) + "\n", stale, unmatched)
