"""The tables a results page quotes, kept equal to the published reports' tables.

``docs/results.md`` quotes tables of ``docs/results/<grid>/report.md`` (a test checks that
every row it shows is a report's). After a grid grows and its report is rebuilt, each
table of the page is replaced by the report table with the same header whose rows share
the most first cells with it, then the most values (a cell's figures before any bracket:
``0.779 ± 0.008`` of ``0.779 ± 0.008 (alie; ~ mimic)``, which a rebuilt report keeps
when only its brackets change), then the most whole rows. A table whose header no report
has, or with two different best matches, is named, to be edited by hand
(``scripts/sync_results_tables.py``).
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


def _values(table: Table) -> set[tuple[str, int, str]]:
    """(first cell, column, the cell's text before any bracket) of each cell of a row."""
    found = set()
    for row in table[2:]:
        cells = [c.strip() for c in row.split("|")[1:-1]]
        found |= {(cells[0], i, c.split("(")[0].strip()) for i, c in enumerate(cells) if i}
    return found


def _closeness(table: Table, candidate: Table) -> tuple[int, int, int]:
    return (len(_first_cells(candidate) & _first_cells(table)),
            len(_values(candidate) & _values(table)), len(set(candidate[2:]) & set(table[2:])))


def best_match(table: Table, candidates: list[Table]) -> Table | None:
    """The candidate with ``table``'s header that shares the most first cells with it,
    then the most values, then the most whole rows (tables of one report alike but for a
    panel); ``None`` if none has its header, or if two different ones tie."""
    same = [c for c in candidates if c[0] == table[0]]
    if not same:
        return None
    best = max(_closeness(table, c) for c in same)
    top = [c for c in same if _closeness(table, c) == best]
    if any(c != top[0] for c in top):
        return None
    return top[0]


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
    headers (with their line) of the tables no report table matches (see the module)."""

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
