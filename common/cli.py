"""Click commands built from the settings declarations (``common.settings``).

A :class:`common.settings.Command` (its entry in ``common.commands.COMMANDS``) names the
dataclasses whose settings the command takes; :func:`options_for` adds one click
option per setting that the command's roles take, with its flag, its ``PS_*``
variable (shown in ``--help``), its default, choices or range, and help. The
command's function then rebuilds the dataclass instances with
:func:`common.settings.take`. Nothing here knows any particular setting.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click

from common import plugins
from common.errors import EXIT_CODES_TEXT, ConfigError
from common.runfile import CONFIG_PARAM, PRINT_PARAM, loader, print_config
from common.settings import Command, Declared, parse_int_list

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "show_default": True,
                    "max_content_width": 100}
EPILOG = (EXIT_CODES_TEXT + " Every option can also be set with the PS_* environment "
          "variable shown, or in a --config file (flag > environment > file > default).")


def _preload() -> ConfigError | None:
    """Load the plugins this process's command line, environment or ``--config`` file
    name by dotted path, before any command or the run's settings (``common.config``,
    which every command module imports after this one) is built: their options become
    settings. What cannot be loaded is refused when a command runs, with one line."""
    try:
        plugins.load_named(plugins.scan_argv(sys.argv[1:], os.environ))
    except ConfigError as exc:
        return exc
    return None


PRELOAD_ERROR = _preload()


def options_for(command: Command) -> Callable[[Callable], Callable]:
    """A decorator adding the click options of the settings ``command`` takes."""
    found = command.settings()
    params = [d.param for d in found]
    duplicated = {p for p in params if params.count(p) > 1}
    if duplicated:
        raise TypeError(f"{command.name}: settings declared twice: {sorted(duplicated)}")

    def apply(f: Callable) -> Callable:
        for d in reversed(found):
            f = _click_option(d)(f)
        return f

    return apply


def settings_command(command: Command, everyone: Mapping[str, Command] | None = None,
                     ) -> Callable[[Callable], click.Command]:
    """A decorator making the click command ``command`` whose options are the settings
    it takes, ``--config FILE`` (a run file: ``common.runfile``; its keys may be the
    settings of any command of ``everyone``) and ``--print-config``, with the common
    help and epilog."""

    def make(f: Callable) -> click.Command:
        @functools.wraps(f)
        def run(**values: Any) -> Any:
            if PRELOAD_ERROR is not None:
                raise click.UsageError(str(PRELOAD_ERROR))
            values.pop(CONFIG_PARAM, None)
            if values.pop(PRINT_PARAM, False):
                print_config(click.get_current_context(), command)
                return None
            return f(**values)

        config = click.option(
            "--config", CONFIG_PARAM, type=click.Path(exists=True, dir_okay=False,
                                                      path_type=Path),
            envvar="PS_CONFIG", show_envvar=True, is_eager=True,
            callback=loader(command, everyone),
            help="Run settings from this TOML file, by their flags' names (rule = "
                 "\"marmed\", workers = 20, byzantine-workers = [0, 1]); the flags and "
                 "PS_* variables win over it, it wins over the defaults. One file serves "
                 "every command of a run: each takes its own settings from it.")
        show = click.option("--print-config", PRINT_PARAM, is_flag=True,
                            envvar="PS_PRINT_CONFIG", show_envvar=True,
                            help="Print the resolved settings as a run file, each with "
                                 "where it came from, and exit.")
        return click.command(command.name, context_settings=CONTEXT_SETTINGS,
                             epilog=EPILOG)(config(show(options_for(command)(run))))

    return make


def _click_option(d: Declared) -> Callable[[Callable], Callable]:
    names = [d.flag, *([d.spec.short] if d.spec.short else []), d.param]
    kwargs: dict[str, Any] = {"envvar": d.env, "show_envvar": True, "help": d.spec.help,
                              "required": d.spec.required}
    if d.kind is bool:
        kwargs.update(is_flag=True, default=False)
    elif d.kind is tuple:
        kwargs.update(type=str, default=",".join(map(str, d.default)) or None,
                      callback=_int_list_callback, metavar="IDS")
    else:
        kwargs.update(type=_click_type(d), default=d.default)
    if d.shown_default is not None:
        kwargs["show_default"] = d.shown_default
    return click.option(*names, **kwargs)


class PluginChoice(click.Choice):
    """A registry's names, or a plugin's dotted path ``package.module:Name``, loaded and
    registered when given (a path that cannot be loaded is refused with why)."""

    def __init__(self, choices: tuple[str, ...], kind: str) -> None:
        super().__init__(choices)
        self.kind = kind

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if isinstance(value, str) and plugins.is_plugin_path(value):
            try:
                plugins.load(self.kind, value)
            except ConfigError as exc:
                self.fail(str(exc), param, ctx)
            return value
        return super().convert(value, param, ctx)


def _click_type(d: Declared) -> click.ParamType | type:
    choices = d.choices
    if choices is not None and d.param in plugins.NAMING:
        return PluginChoice(choices, plugins.NAMING[d.param])
    if choices is not None:
        return click.Choice(choices)
    low, high = d.spec.minimum, d.spec.maximum
    if d.kind is int and (low is not None or high is not None):
        return click.IntRange(min=low, max=high)
    if d.kind is float and (low is not None or high is not None):
        return click.FloatRange(min=low, max=high)
    if d.kind is Path:
        return click.Path(path_type=Path)
    return d.kind


def _int_list_callback(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple:
    try:
        return parse_int_list(value or "")
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None
