"""Grids written in a file: ``ps-experiment run GRID.toml``.

A grid file (TOML, read with ``tomllib``) gives run settings by their command-line names
(``rule``, ``workers``, ``shards``, ``worker-momentum``, ``worker-attack``,
``byzantine-workers``, an attack's ``alie-z``...: every setting a launcher takes, as
declared in ``common.run.config`` and the attacks) and ``seeds`` (a count, seeds 0..N-1, or
a list of seeds). A key left out keeps its setting's default.

A list value is an axis, and the grid is the Cartesian product of its axes (ByzFL's
convention); a setting that holds a list (``byzantine-workers = [0, 1, 2]``) has a list
of such lists as its axis. ``[[exclude]]`` tables remove the cells that match all their
keys; ``[[only]]`` tables, if any, keep only the cells that match at least one; in those
tables a list means any of its values. For an optional setting (``pre``, ``q``) ``""``
means unset.

``base = "run.toml"`` (a path relative to the grid file) starts the grid from a run
file (``common.conf.runfile``, ``--config``'s): its settings are the grid's where the grid
does not give them, each one value (a run setting holding a list, such as
``byzantine-workers``, one point); its keys of settings no run takes (``bind``,
``servers``...) are left, as every command leaves the others'.

The settings of the whole invocation (``data-dir``, ``eval-every``, ``eval-samples``)
take one value. ``[report]`` may name the axes of a worst-case heat map: ``rows``,
``columns`` and ``worst_over`` (an axis; ``defence``: the pre-aggregation chain and the
rule together; ``heterogeneity``, where ``partition`` is an axis: the partition with its
``alpha`` or ``gamma`` where those are axes too, e.g. ``dirichlet α=0.1``), and may name
a ``baseline``: a value of ``worst_over`` (a key of the grid) that is a reference, not a
member of any worst case (``"none"``: the worst case is over the attacks, ByzFL's; the
runs without attack stay in the table of every cell), and ``at_rounds``: earlier rounds
whose worst cases the report sets beside the final ones (have the curves settled?).

Everything is checked before a cell runs: an unknown key, a value outside its setting's
choices or range, and a cell the rule or the attack cannot run (``RunConfig.validate``,
``AttackConfig.validate``: q too large for Krum...) are each refused with a
``ConfigError`` of one line naming the key or the cell. A cell of a file has the cache
key of a built-in grid's cell with the same settings (``Cell.key``).
"""

from __future__ import annotations

import difflib
import itertools
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from common.conf.runfile import read_run_file
from common.conf.settings import EXPERIMENT, SIMULATE, Command, Declared, check_value, declared
from common.errors import ConfigError
from common.learn.attacks import ATTACKS, NO_ATTACK
from common.learn.rules import RuleError
from common.learn.rules.base import option_settings
from common.learn.rules.pre import PRE_AGGREGATORS
from common.run import plugins
from common.run.commands import COMMANDS
from common.run.config import AttackConfig, RunConfig
from ps.experiments.grid import Cell

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it entered the standard library
    import tomli as tomllib

SEEDS = "seeds"
SEED = "seed"
EXCLUDE, ONLY, REPORT, BASE = "exclude", "only", "report", "base"
DEFENCE = "defence"  # a report axis: the pre-aggregation chain and the rule together
HETEROGENEITY = "heterogeneity"  # a report axis: the partition with its alpha or gamma
PARTITION_KEYS = ("partition", "alpha", "gamma")  # the grid keys HETEROGENEITY stands for
REPORT_KEYS = ("rows", "columns", "worst_over")
BASELINE, AT_ROUNDS = "baseline", "at_rounds"  # [report]'s optional keys


def defence_keys() -> tuple[str, ...]:
    """The grid keys DEFENCE stands for: the rule, the chain and the chain's options
    (its name carries them: ``GridCell.defence``)."""
    options = (d.flag.removeprefix("--") for cls in PRE_AGGREGATORS.values()
               for d in option_settings(cls) if d.flag)
    return ("rule", "pre", *dict.fromkeys(options))

FIGURE = "grid"  # the figure of every cell of a grid file
SHIPPED = "grids"  # the package folder of the shipped grid files


def key_of(d: Declared) -> str:
    """The name of setting ``d`` in a grid file: its flag without the dashes."""
    return d.flag.removeprefix("--")


def cell_settings() -> dict[str, tuple[type, Declared]]:
    """Grid-file key -> (class, declaration) of every setting of one run: the run's, the
    scenario's and every registered attack's parameters (what a launcher takes)."""
    return {key_of(d): (cls, d) for cls in (RunConfig, AttackConfig, *ATTACKS.values())
            for d in declared(cls) if d.takes({SIMULATE})}


# ps-experiment's settings that are not a run's (--data-dir, --eval-every, --eval-samples):
# one value per grid, from the file or (first) the command line of ``ps-experiment run``
INVOCATION = Command("ps-experiment run", frozenset({EXPERIMENT}), lambda: tuple(
    c for c in COMMANDS["ps-experiment"].classes() if c is not RunConfig))


def invocation_settings() -> dict[str, Declared]:
    """Grid-file key -> declaration of each setting of :data:`INVOCATION`."""
    return {key_of(d): d for d in INVOCATION.settings()}


@dataclass(frozen=True)
class GridCell(Cell):
    """A cell of a grid file, with its values on the grid's axes (the seed's aside)."""

    axes: tuple[tuple[str, Any], ...] = ()

    @property
    def defence(self) -> str:
        """The rule after its chain, each pre-aggregator with the options it is given
        other than their defaults (a grid may sweep them): ``bucketing(s=3)+geomed``."""
        pre = self.run.get("pre")
        if not pre:
            return self.rule
        steps = []
        for name in pre.split(","):
            changed = [f"{d.name}={self.run[d.param]:g}"
                       for d in option_settings(PRE_AGGREGATORS[name])
                       if d.param in self.run and self.run[d.param] != d.default]
            steps.append(f"{name}({','.join(changed)})" if changed else name)
        return "+".join([*steps, self.rule])

    def tags(self) -> dict[str, Any]:
        return {**super().tags(), "axes": dict(self.axes)}

    def label(self) -> str:
        where = " ".join(f"{k}={value_text(v)}" for k, v in self.axes) or self.defence
        return f"{self.figure}/{where}/seed {self.seed}"


@dataclass(frozen=True)
class ReportAxes:
    """``[report]``: the heat map's rows and columns, and the axis taken at its worst."""

    rows: str
    columns: str
    worst_over: str
    baseline: str | None = None  # a value of worst_over in no worst case (the reference)
    at_rounds: tuple[int, ...] = ()  # earlier rounds whose worst cases the report shows


@dataclass(frozen=True)
class GridFile:
    """A grid file, read and checked: its cells and how to run and report them."""

    name: str
    cells: list[GridCell]
    axes: tuple[str, ...]  # the keys with several values, in file order (not the seed)
    invocation: dict[str, Any]  # field name -> value of the invocation's settings
    report: ReportAxes | None


def load_grid(path: Path) -> GridFile:
    """Read grid file ``path`` and check every cell; ``ConfigError`` (one line) if not."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not TOML: {exc}") from None
    if BASE in data:
        if not isinstance(data[BASE], str):
            raise ConfigError(f"{path.name}: key 'base' names a run file, got {data[BASE]!r}")
        data = {**base_of(path.parent / data[BASE]), **data}
        del data[BASE]
    return parse_grid(data, path.name)


def base_of(path: Path) -> dict[str, Any]:
    """The grid keys that the run file at ``path`` gives (see the module docstring);
    ``ConfigError`` for a key no command takes, or a table."""
    cells_known, invocation_known = cell_settings(), invocation_settings()
    everyone = {key_of(d) for c in COMMANDS.values() for d in c.settings()}
    out: dict[str, Any] = {}
    for raw, value in read_run_file(path).items():
        key = raw.replace("_", "-")
        if isinstance(value, dict) or key not in everyone:
            close = difflib.get_close_matches(key, sorted(everyone), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{path}: {raw!r} is not a setting{hint}")
        if key in cells_known:
            kind = cells_known[key][1].kind
            out[key] = [value] if kind is tuple and isinstance(value, list) else value
        elif key in invocation_known:
            out[key] = value
    return out


def parse_grid(data: Mapping[str, Any], name: str) -> GridFile:
    """The grid of a grid file's parsed ``data`` (``name``: for messages)."""
    for key, value in data.items():  # plugins by dotted path: registered before the checks
        for one in value if isinstance(value, list) else [value]:
            plugins.load_plugins({key.replace("-", "_"): one})
    cells_known, invocation_known = cell_settings(), invocation_settings()
    grid_keys = (SEEDS, EXCLUDE, ONLY, REPORT, BASE)
    known = [*cells_known, *invocation_known, *grid_keys]
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{name}: unknown key {key!r}{hint}; a grid file's keys are "
                              "the run settings' flags without '--', and seeds, exclude, "
                              "only, report, base")
    invocation = {}
    for key, d in invocation_known.items():
        if key in data:
            if isinstance(data[key], list):
                raise ConfigError(f"{name}: key {key!r} takes one value for the whole grid")
            invocation[d.name] = _convert(f"{name}: key {key!r}", d, data[key])
    values = {key: _values(f"{name}: key {key!r}", cells_known[key][1], data[key])
              for key in data if key in cells_known}
    values = _with_seeds(name, data.get(SEEDS), values)
    axes = tuple(k for k, v in values.items() if len(v) > 1 and k != SEED)
    excludes = _rules(name, EXCLUDE, data.get(EXCLUDE, []), cells_known, values)
    onlys = _rules(name, ONLY, data.get(ONLY, []), cells_known, values)
    cells = []
    for combination in expand(values, excludes, onlys):
        cell = _cell(combination, cells_known, axes)
        try:
            cell.configs()
        except (ConfigError, RuleError, ValueError) as exc:
            raise ConfigError(f"{name}: cell {cell.label()}: {exc}") from None
        cells.append(cell)
    if not cells:
        raise ConfigError(f"{name}: no cell left after [[exclude]] and [[only]]")
    report = _report(name, data.get(REPORT), axes, values)
    return GridFile(name, cells, axes, invocation, report)


def expand(values: Mapping[str, list[Any]], excludes: list[dict[str, list[Any]]],
           onlys: list[dict[str, list[Any]]]) -> Iterator[dict[str, Any]]:
    """Each combination of ``values`` (key -> its values; the seed varies slowest) that
    no ``excludes`` table matches and, if there are ``onlys``, one of them does. A
    table matches a combination when each of its keys has one of the table's values."""
    keys = sorted(values, key=lambda k: k != SEED)
    for picked in itertools.product(*(values[k] for k in keys)):
        combination = dict(zip(keys, picked, strict=True))
        if any(_matches(t, combination) for t in excludes):
            continue
        if onlys and not any(_matches(t, combination) for t in onlys):
            continue
        yield combination


def _matches(table: Mapping[str, list[Any]], combination: Mapping[str, Any]) -> bool:
    return all(combination[k] in options for k, options in table.items())


def _values(where: str, d: Declared, raw: Any) -> list[Any]:
    """The values of a key: one, or each of an axis (distinct, at least one)."""
    axis = isinstance(raw, list) and (d.kind is not tuple
                                      or any(isinstance(v, list) for v in raw))
    if not axis:
        return [_convert(where, d, raw)]
    if not raw:
        raise ConfigError(f"{where}: an empty list gives no value")
    out = [_convert(where, d, v) for v in raw]
    twice = [v for i, v in enumerate(out) if v in out[:i]]
    if twice:
        raise ConfigError(f"{where}: value {value_text(twice[0])} given twice")
    return out


def _convert(where: str, d: Declared, raw: Any) -> Any:
    """A TOML value as setting ``d``'s value, checked against its choices and range."""
    if d.optional and raw == "":
        return None
    integer = isinstance(raw, int) and not isinstance(raw, bool)
    value: Any  # of the setting's kind (None where raw is not one)
    if d.kind is tuple:
        ok = isinstance(raw, list) and all(isinstance(v, int) and not isinstance(v, bool)
                                           for v in raw)
        value, wanted = (tuple(raw) if ok else None), "a list of integers"
    elif d.kind is float:
        ok = integer or isinstance(raw, float)
        value, wanted = (float(raw) if ok else None), "a number"
    elif d.kind is int:
        ok, value, wanted = integer, raw, "an integer"
    elif d.kind is bool:
        ok, value, wanted = isinstance(raw, bool), raw, "true or false"
    else:  # str, Path
        ok = isinstance(raw, str)
        value, wanted = (d.kind(raw) if ok else None), "a string"
    if not ok:
        raise ConfigError(f"{where}: expected {wanted}, got {raw!r}")
    try:
        check_value(d, value, "the value")
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return value


def _with_seeds(name: str, seeds: Any, values: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """``values`` with the seed's: from ``seeds`` (a count or a list), else ``seed``'s."""
    if seeds is None:
        return values
    if SEED in values:
        raise ConfigError(f"{name}: give seeds or seed, not both")
    if isinstance(seeds, int) and not isinstance(seeds, bool) and seeds >= 1:
        return {**values, SEED: list(range(seeds))}
    _, d = cell_settings()[SEED]
    if not isinstance(seeds, list):
        raise ConfigError(f"{name}: key 'seeds': expected a count >= 1 or a list of seeds, "
                          f"got {seeds!r}")
    return {**values, SEED: _values(f"{name}: key 'seeds'", d, seeds)}


def _rules(name: str, kind: str, tables: Any, known: Mapping[str, tuple[type, Declared]],
           values: Mapping[str, list[Any]]) -> list[dict[str, list[Any]]]:
    """The ``[[exclude]]`` or ``[[only]]`` tables: key -> the values it matches, each a
    key and values of the grid (a table naming others would match nothing: a typo)."""
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{name}: {kind} must be tables, written [[{kind}]]")
    out = []
    for i, table in enumerate(tables, start=1):
        where = f"{name}: [[{kind}]] {i}"
        if not table:
            raise ConfigError(f"{where}: an empty table")
        rule = {}
        for key, raw in table.items():
            if key not in values:
                what = "a key the grid does not set" if key in known else "an unknown key"
                raise ConfigError(f"{where}: {key!r} is {what}")
            rule[key] = _values(f"{where}, key {key!r}", known[key][1], raw)
            absent = [v for v in rule[key] if v not in values[key]]
            if absent:
                raise ConfigError(f"{where}, key {key!r}: {value_text(absent[0])} is not one "
                                  "of the grid's values")
        out.append(rule)
    return out


def _cell(combination: Mapping[str, Any], known: Mapping[str, tuple[type, Declared]],
          axes: tuple[str, ...]) -> GridCell:
    """The cell of one combination: every run setting (defaults where not given), the
    attack settings given, its scenario (the attack: the workers', else the proxy's)."""
    run = {d.name: combination.get(key, d.default)
           for key, (cls, d) in known.items() if cls is RunConfig}
    attack = {d.param: combination[key] for key, (cls, d) in known.items()
              if cls is not RunConfig and key in combination}
    worker = attack.get("worker_attack", NO_ATTACK)
    scenario = worker if worker != NO_ATTACK else attack.get("proxy_attack", NO_ATTACK)
    return GridCell(FIGURE, scenario, run, attack, tuple((k, combination[k]) for k in axes))


def _report(name: str, table: Any, axes: tuple[str, ...],
            values: Mapping[str, list[Any]]) -> ReportAxes | None:
    """``[report]``: three axes of the grid (``defence`` counts as one), and perhaps a
    baseline value of ``worst_over``."""
    if table is None:
        return None
    where = f"{name}: [report]"
    if not isinstance(table, dict) \
            or sorted(set(table) - {BASELINE, AT_ROUNDS}) != sorted(REPORT_KEYS):
        raise ConfigError(f"{where}: give exactly {', '.join(REPORT_KEYS)} (and perhaps "
                          f"{BASELINE}, {AT_ROUNDS})")
    usable = (*axes, DEFENCE, *((HETEROGENEITY,) if "partition" in axes else ()))
    for key in REPORT_KEYS:
        if table[key] not in usable:
            raise ConfigError(f"{where}: {key} = {table[key]!r} is not an axis of the grid "
                              f"(axes: {', '.join(usable)})")
    named = [table[key] for key in REPORT_KEYS]
    if len(set(named)) < len(named):
        raise ConfigError(f"{where}: rows, columns and worst_over must be three different "
                          "axes")
    for combined, parts in ((DEFENCE, defence_keys()), (HETEROGENEITY, PARTITION_KEYS)):
        if combined in named and any(n in parts for n in named):
            raise ConfigError(f"{where}: rows, columns and worst_over must be three "
                              f"different axes ({combined} holds {', '.join(parts)})")
    baseline = table.get(BASELINE)
    if baseline is not None:
        worst_over = table["worst_over"]
        if worst_over not in axes:
            raise ConfigError(f"{where}: a {BASELINE} needs worst_over to be a key of the "
                              f"grid, not {worst_over!r}")
        texts = [value_text(v) for v in values[worst_over]]
        baseline = value_text(tuple(baseline) if isinstance(baseline, list) else baseline)
        if baseline not in texts:
            raise ConfigError(f"{where}: {BASELINE} = {baseline!r} is not a value of "
                              f"{worst_over} ({', '.join(texts)})")
    return ReportAxes(table["rows"], table["columns"], table["worst_over"], baseline,
                      _at_rounds(where, table.get(AT_ROUNDS, []), values))


def _at_rounds(where: str, given: Any, values: Mapping[str, list[Any]]) -> tuple[int, ...]:
    """``at_rounds``: rounds, each before every cell's last (``rounds``)."""
    last = min(values.get("rounds", [RunConfig().rounds]))
    if not isinstance(given, list) or not all(
            isinstance(r, int) and not isinstance(r, bool) and 1 <= r < last for r in given):
        raise ConfigError(f"{where}: {AT_ROUNDS} = {given!r}: give a list of rounds, each "
                          f"from 1 to {last - 1} (before the last round, {last})")
    return tuple(sorted(set(given)))


def shipped() -> dict[str, Path]:
    """The grid files shipped in the package, by name (``paper``, ``modern``...)."""
    folder = resources.files("ps.experiments") / SHIPPED
    return {Path(f.name).stem: Path(str(f)) for f in sorted(folder.iterdir(),
                                                                key=lambda f: f.name)
            if f.name.endswith(".toml")}


def value_text(value: Any) -> str:
    """A value of a setting as a grid's labels and tables show it."""
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "-"
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
