"""Run settings in a file: ``--config run.toml`` for every command, and
``--print-config``.

The file is TOML, one key per setting, by the setting's own name: its flag without the
dashes (``rule = "marmed"``, ``workers = 20``, ``batch-size = 32`` or ``batch_size``,
``byzantine-workers = [0, 1]``). One file serves every command of a run: each takes the
keys of the settings it takes and leaves the others' (a server ignores ``workers``'s
sibling ``timeout``); a key that is no command's setting, or a value of the wrong type
or outside its choices or range, is refused naming the key, the file and what is valid.

Precedence, as click resolves a parameter: the command line, then the ``PS_*``
variable, then this file, then the declared default (the file's values are the
command's ``default_map``). ``--print-config`` prints the resolved settings as a run
file, each with where it came from, and exits.
"""

from __future__ import annotations

import difflib
import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from common.conf.settings import Command, Declared, check_value
from common.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it entered the standard library
    import tomli as tomllib

CONFIG_PARAM = "config"
PRINT_PARAM = "print_config"
# Every settings command's two options about its settings, which are no settings
RUN_FILE_FLAGS = ("--config", "--print-config")


def read_run_file(path: Path) -> dict[str, Any]:
    """The file's top-level table (``ConfigError`` naming the file if it is not TOML)."""
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not a TOML file: {exc}") from None


def defaults_from(path: Path, command: Command,
                  everyone: Iterable[Command]) -> dict[str, Any]:
    """The click defaults (by parameter name) that the file at ``path`` gives
    ``command``: its keys of the settings ``command`` takes, checked; ``ConfigError``
    for a key no command in ``everyone`` takes, or a value ``command`` cannot take."""
    table = read_run_file(path)
    known = {d.param: d.flag[2:] for c in [command, *everyone] for d in c.settings()}
    taken = {d.param: d for d in command.settings()}
    out: dict[str, Any] = {}
    for key, value in table.items():
        param = key.replace("-", "_")
        if isinstance(value, dict):
            raise ConfigError(f"{path}: [{key}] is a table; a run file is flat, one key per "
                              f"setting (every command takes its own from it)")
        if param not in known:
            near = difflib.get_close_matches(key.replace("_", "-"), sorted(known.values()),
                                             n=3)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            raise ConfigError(f"{path}: {key!r} is not a setting{hint} (the keys are the "
                              f"settings' flags without the dashes: see --help)")
        d = taken.get(param)
        if d is not None:
            out[param] = _click_value(d, value, f"{path}: {key}")
    return out


def _click_value(d: Declared, value: Any, name: str) -> Any:
    """``value`` as read from TOML, checked as setting ``d`` and given as click takes
    it (a list of ids as ``"0,1"``); ``ConfigError`` naming ``name`` otherwise."""
    kind = d.kind
    if kind is tuple:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list) or not all(_is_int(v) or (
                isinstance(v, str) and v.isdigit()) for v in value):
            raise ConfigError(f"{name} must be a list of integers, got {value!r}")
        ids = tuple(int(v) for v in value)
        check_value(d, ids, name)
        return ",".join(map(str, ids))
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {value!r}")
        return value
    if kind is int and not _is_int(value):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if kind is float:
        if not (_is_int(value) or isinstance(value, float)):
            raise ConfigError(f"{name} must be a number, got {value!r}")
        value = float(value)
    if kind in (str, Path) and not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, got {value!r}")
    check_value(d, value, name)
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def print_config(ctx: click.Context, command: Command) -> None:
    """Print ``ctx``'s resolved settings as a run file, each line saying where its value
    came from (the command line, a ``PS_*`` variable, the ``--config`` file, the
    default); unset ones commented out."""
    path = ctx.params.get(CONFIG_PARAM)
    click.echo(f"# {command.name}: the resolved settings (flag > environment > "
               f"{'file ' + str(path) if path else 'file'} > default)")
    for d in command.settings():
        value = ctx.params.get(d.param)
        source = ctx.get_parameter_source(d.param)
        sources: dict[ParameterSource | None, str] = {
            ParameterSource.COMMANDLINE: f"from {d.flag}",
            ParameterSource.ENVIRONMENT: f"from {d.env}",
            ParameterSource.DEFAULT_MAP: f"from {path}"}
        where = sources.get(source, "default")
        key = d.flag.lstrip("-")
        if value is None:
            click.echo(f"# {key} =  (unset; {where})")
        else:
            click.echo(f"{key} = {_toml(value)}  # {where}")


def _toml(value: Any) -> str:
    """``value`` written as TOML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value))


def loader(command: Command, everyone: Mapping[str, Command] | None):
    """The ``--config`` option's callback: the file's values become ``ctx.default_map``."""

    def load(ctx: click.Context, _param: click.Parameter, path: Path | None) -> Path | None:
        if path is None:
            return None
        commands = list(everyone.values()) if everyone else [command]
        try:
            defaults = defaults_from(path, command, commands)
        except ConfigError as exc:
            raise click.BadParameter(str(exc)) from None
        ctx.default_map = {**(ctx.default_map or {}), **defaults}
        return path

    return load
