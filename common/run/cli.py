"""Click commands built from the settings declarations (``common.conf.settings``).

A :class:`common.conf.settings.Command` (its entry in ``common.run.commands.COMMANDS``) names the
dataclasses whose settings the command takes; :func:`options_for` adds one click
option per setting that the command's roles take, with its flag, its ``PS_*``
variable (shown in ``--help``), its default, choices or range, and help. The
command's function then rebuilds the dataclass instances with
:func:`common.conf.settings.take`. Nothing here knows any particular setting.

A :class:`SettingsCommand` loads the plugins its command line, environment and
``--config`` file name (and the installed ones) when it starts, then builds its
options: the one place where a process reads them (no import does).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from common.conf.runfile import CONFIG_PARAM, PRINT_PARAM, loader, print_config
from common.conf.settings import Command, Declared, parse_int_list
from common.errors import EXIT_CODES_TEXT, ConfigError
from common.run import plugins

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "show_default": True,
                    "max_content_width": 100}
EPILOG = (EXIT_CODES_TEXT + " Every option can also be set with the PS_* environment "
          "variable shown, or in a --config file (flag > environment > file > default).")


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


def setting_options(command: Command) -> list[click.Option]:
    """The click options of the settings ``command`` takes, in its ``--help`` order."""
    holder = options_for(command)(lambda: None)
    return list(reversed(holder.__click_params__))  # type: ignore[attr-defined]  # click's


class SettingsCommand(click.Command):
    """A click command whose options are the settings of ``command``, built when it
    runs, after the plugins it may name are loaded (``common.run.plugins.load_plugins``
    with what :func:`common.run.plugins.scan_argv` finds in its arguments, the
    environment and a ``--config`` file): a plugin's settings are its options too.
    What cannot be loaded is refused when the command runs, with one line."""

    def __init__(self, command: Command, callback: Callable, own: list[click.Parameter]
                 ) -> None:
        self.command = command
        self.own = own
        self.plugin_error: ConfigError | None = None
        super().__init__(command.name, context_settings=CONTEXT_SETTINGS, epilog=EPILOG,
                         callback=callback, params=[*own, *setting_options(command)],
                         help=inspect.getdoc(callback))

    def main(self, args: Sequence[str] | None = None, *more: Any, **extra: Any) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        try:
            plugins.load_plugins(plugins.scan_argv(argv, os.environ))
            self.plugin_error = None
        except ConfigError as exc:
            self.plugin_error = exc
            if not {"-h", "--help"} & set(argv):  # refused now, before a plugin's own flag
                error = click.UsageError(str(exc))  # would read as an unknown option
                if not extra.get("standalone_mode", True):
                    raise error from None
                error.show()
                sys.exit(error.exit_code)
        self.params = [*self.own, *setting_options(self.command)]
        return super().main(argv, *more, **extra)


def settings_command(command: Command, everyone: Mapping[str, Command] | None = None,
                     ) -> Callable[[Callable], click.Command]:
    """A decorator making the click command ``command`` whose options are the settings
    it takes, ``--config FILE`` (a run file: ``common.conf.runfile``; its keys may be the
    settings of any command of ``everyone``) and ``--print-config``, with the common
    help and epilog."""

    def make(f: Callable) -> click.Command:
        @functools.wraps(f)
        def run(**values: Any) -> Any:
            command_now = click.get_current_context().command
            error = command_now.plugin_error if isinstance(command_now, SettingsCommand) else None
            if error is not None:
                raise click.UsageError(str(error))
            values.pop(CONFIG_PARAM, None)
            if values.pop(PRINT_PARAM, False):
                print_config(click.get_current_context(), command)
                return None
            return f(**values)

        config = click.Option(
            ["--config", CONFIG_PARAM], type=click.Path(exists=True, dir_okay=False,
                                                        path_type=Path),
            envvar="PS_CONFIG", show_envvar=True, is_eager=True,
            callback=loader(command, everyone),
            help="Run settings from this TOML file, by their flags' names (rule = "
                 "\"marmed\", workers = 20, byzantine-workers = [0, 1]); the flags and "
                 "PS_* variables win over it, it wins over the defaults. One file serves "
                 "every command of a run: each takes its own settings from it.")
        show = click.Option(["--print-config", PRINT_PARAM], is_flag=True,
                            envvar="PS_PRINT_CONFIG", show_envvar=True,
                            help="Print the resolved settings as a run file, each with "
                                 "where it came from, and exit.")
        return SettingsCommand(command, run, [config, show])

    return make


def _click_option(d: Declared) -> Callable[[Callable], Callable]:
    names = [d.flag, *([d.spec.short] if d.spec.short else []), d.param]
    kwargs: dict[str, Any] = {"envvar": d.env, "show_envvar": True, "help": d.spec.help,
                              "required": d.spec.required}
    if d.kind is bool:
        kwargs.update(is_flag=True, default=False)
    elif d.kind is tuple:
        kwargs.update(type=str, default=",".join(map(str, d.default)) or None,
                      callback=_int_list_callback, metavar=d.spec.metavar or "IDS")
    else:
        kwargs.update(type=_click_type(d), default=d.default)
    if d.shown_default is not None:
        kwargs["show_default"] = d.shown_default
    return click.option(*names, **kwargs)


class LiveChoice(click.Choice):
    """The names a setting may take, read when a value is checked or ``--help`` shows
    them (a registry's, with the plugins loaded by then), not when the option is made."""

    def __init__(self, choices_of: Callable[[], Sequence[str]]) -> None:
        self.choices_of = choices_of
        super().__init__(tuple(choices_of()))

    @property
    def choices(self) -> Sequence[str]:
        return tuple(self.choices_of())

    @choices.setter
    def choices(self, value: Sequence[str]) -> None:
        """Set by click's constructor: the live names are read instead."""


class PluginChoice(LiveChoice):
    """A registry's names, or a plugin's dotted path ``package.module:Name``, loaded and
    registered when given (a path that cannot be loaded is refused with why)."""

    def __init__(self, choices_of: Callable[[], Sequence[str]], kind: str) -> None:
        super().__init__(choices_of)
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
    if d.choices is not None:

        def choices_of() -> tuple[str, ...]:
            return d.choices or ()

        if d.param in plugins.NAMING:
            return PluginChoice(choices_of, plugins.NAMING[d.param])
        return LiveChoice(choices_of)
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
