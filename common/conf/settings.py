"""Every setting of the system, declared once, next to the dataclass field it fills.

A setting is a dataclass field made with :func:`setting`: its default, help text,
choices or range, command-line flag, ``PS_*`` environment variable, the roles
(processes) that take it and whether it enters the run hash. Everything else is
derived from that declaration:

* the click options of every command (``common.run.cli.options_for``) and so ``--help``,
  from the one table of which settings classes each command takes (``common.run.commands``);
* the values a command was given, back as dataclass instances (``take``);
* the argv a launcher hands a child process (``to_argv``) and the environment a
  compose service gets (``to_environ``);
* the checks of ranges and choices, whatever the source (``check_ranges``);
* the option tables of the README (``scripts/gen_docs.py``).

Precedence, everywhere: command-line flag > ``PS_*`` environment variable > the
``--config`` run file (``common/conf/runfile.py``) > default.

Roles name the kinds of process, not the commands: ``ps-worker`` serves the roles
``worker`` and ``evaluator`` (a :class:`Command` names its roles). ``ps-experiment``,
which runs grids of runs, has the role ``experiment``: it takes the few run settings
that a grid does not vary (``--dataset``, ``--workers``, ...).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import ConfigError

SERVER, WORKER, EVALUATOR, PROXY, CLUSTER, SIMULATE = (
    "server", "worker", "evaluator", "proxy", "cluster", "simulate",
)
# The roles of a run's processes (a setting of every run takes ``roles=ROLES``).
ROLES: tuple[str, ...] = (SERVER, WORKER, EVALUATOR, PROXY, CLUSTER, SIMULATE)
EXPERIMENT = "experiment"  # ps-experiment: a grid of runs, not one of a run's processes
ALL_ROLES: tuple[str, ...] = (*ROLES, EXPERIMENT)
# Roles that start a whole run and so take every setting of the run and its attack.
LAUNCHERS = frozenset({CLUSTER, SIMULATE})
METADATA_KEY = "setting"

Choices = Sequence[str] | Callable[[], Sequence[str]]


@dataclass(frozen=True)
class Setting:
    """What the declaration of one setting says (see :func:`setting`)."""

    help: str
    roles: frozenset[str] | None
    flag: str | None = None
    short: str | None = None
    env: str | None = None
    choices: Choices | None = None
    minimum: float | None = None
    maximum: float | None = None
    hashed: bool = False
    required: bool = False
    hash_default: bool = True
    metavar: str | None = None


def setting(
    default: Any,
    help: str,
    *,
    roles: Iterable[str] | None = None,
    flag: str | None = None,
    short: str | None = None,
    env: str | None = None,
    choices: Choices | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    hashed: bool = False,
    required: bool = False,
    hash_default: bool = True,
    metavar: str | None = None,
) -> Any:
    """A dataclass field that is a setting.

    ``flag`` defaults to ``--<field-name>`` and ``env`` to ``PS_<FLAG_NAME>``;
    ``roles`` left out means the owning class supplies them (``setting_roles``, as the
    attacks do from where they can run); ``choices`` may be a callable read when a
    command is built, so a registry's names are always current; ``hash_default=False``:
    a hashed setting enters the run hash only when it differs from its default (one
    added later, so that every earlier run keeps its hash); ``metavar``: the value's
    name in ``--help`` where the type's is not enough.
    """
    unknown = set(roles or ()) - set(ALL_ROLES)
    if unknown:
        raise ValueError(f"unknown roles {sorted(unknown)}")
    spec = Setting(help=help, roles=None if roles is None else frozenset(roles), flag=flag,
                   short=short, env=env, choices=choices, minimum=minimum, maximum=maximum,
                   hashed=hashed, required=required, hash_default=hash_default,
                   metavar=metavar)
    return dataclasses.field(default=default, metadata={METADATA_KEY: spec})


@dataclass(frozen=True)
class Declared:
    """A setting resolved against its field: name, value type, default, flag, variable."""

    name: str
    kind: type
    optional: bool
    default: Any
    spec: Setting
    flag: str
    env: str
    roles: frozenset[str]
    shown_default: str | None = None  # --help's text for a default a command left unset

    @property
    def param(self) -> str:
        """The name of the click parameter (unique per command: derived from the flag)."""
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def choices(self) -> tuple[str, ...] | None:
        c = self.spec.choices
        if c is None:
            return None
        return tuple(c() if callable(c) else c)

    def takes(self, roles: Iterable[str]) -> bool:
        return bool(self.roles & set(roles))

    def render(self, value: Any) -> str:
        """``value`` as the text a flag or an environment variable carries."""
        if self.kind is tuple:
            return ",".join(str(int(v)) for v in value)
        if self.kind is float:
            return repr(float(value))
        if self.kind is bool:
            return "1" if value else "0"
        return str(value)


def declared(cls: type) -> tuple[Declared, ...]:
    """The settings of dataclass ``cls``, in field order, then those its classmethod
    ``extra_settings`` declares now, if it has one (``RunConfig``: the options of the
    plugin rules and pre-aggregators registered in this process, which no import
    makes fields)."""
    extra = getattr(cls, "extra_settings", None)
    return _fields_declared(cls) + (tuple(extra()) if extra is not None else ())


def construct(cls: type, values: Mapping[str, Any]) -> Any:
    """An instance of ``cls`` from its settings by name: through its classmethod
    ``from_settings`` where it has one (a class with extra settings), else its own."""
    build = getattr(cls, "from_settings", None)
    return build(**values) if build is not None else cls(**values)


@functools.cache
def _fields_declared(cls: type) -> tuple[Declared, ...]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(METADATA_KEY)
        if spec is None:
            continue
        kind, optional = _value_type(hints[f.name], f"{cls.__name__}.{f.name}")
        flag = spec.flag or "--" + f.name.replace("_", "-")
        # a setting without roles takes its class's (an attack's: where it can run)
        roles = spec.roles
        if roles is None:
            own_roles = getattr(cls, "setting_roles", None)
            if own_roles is None:
                raise TypeError(f"{cls.__name__}.{f.name}: no roles, and its class names none")
            roles = frozenset(own_roles())
        out.append(Declared(
            name=f.name, kind=kind, optional=optional, default=f.default,
            spec=spec, flag=flag, env=spec.env or "PS_" + flag[2:].upper().replace("-", "_"),
            roles=roles,
        ))
    return tuple(out)


def _value_type(hint: Any, where: str) -> tuple[type, bool]:
    """(base type, optional) of a field annotation such as ``int | None``."""
    optional = False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        if len(args) != 1:
            raise TypeError(f"{where}: a setting holds one type, got {hint}")
        hint = args[0]
    if typing.get_origin(hint) is tuple:
        return tuple, optional  # tuple[int, ...]: comma-separated integers
    if hint in (int, float, str, bool, Path):
        return hint, optional
    raise TypeError(f"{where}: unsupported setting type {hint}")


@dataclass(frozen=True)
class Command:
    """One command: the roles it serves and the settings classes it takes (the table of
    every command is ``common.run.commands.COMMANDS``).

    ``classes`` is read when asked (a registry, such as the attacks', may have grown);
    ``unset`` names settings the command leaves unset (None) by default, each with the
    text its ``--help`` shows for what decides them then.
    """

    name: str
    roles: frozenset[str]
    classes: Callable[[], tuple[type, ...]]
    unset: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def settings(self) -> list[Declared]:
        """The settings this command takes, in the order of its classes."""
        found = [d for cls in self.classes() for d in declared(cls) if d.takes(self.roles)]
        missing = set(self.unset) - {d.name for d in found}
        if missing:
            raise TypeError(f"{self.name}: unset names no setting it takes: {sorted(missing)}")
        return [dataclasses.replace(d, default=None, optional=True,
                                    shown_default=self.unset[d.name])
                if d.name in self.unset else d for d in found]

    def handed(self, instances: Iterable[Any]) -> list[Any]:
        """``instances``, to be handed to a process of this command; ``TypeError`` for one
        of a class the command does not take (the process would refuse its flags)."""
        classes = self.classes()
        given = list(instances)
        foreign = [type(i).__name__ for i in given if type(i) not in classes]
        if foreign:
            raise TypeError(f"{self.name} takes no settings of {', '.join(foreign)}")
        return given


def take(cls: type, values: Mapping[str, Any], roles: Iterable[str], **fixed: Any) -> Any:
    """An instance of ``cls`` from parsed command values (keyed by ``Declared.param``).

    Settings the command's ``roles`` do not take keep their defaults; ``fixed``
    gives fields directly (by field name).
    """
    kwargs = {d.name: values[d.param] for d in declared(cls)
              if d.takes(roles) and d.param in values}
    return construct(cls, {**kwargs, **fixed})


def to_argv(instance: Any, role: str) -> list[str]:
    """Flags that give a ``role`` process every setting of ``instance`` it takes.

    Unset optional values and empty lists are left out; a false switch too.
    """
    argv: list[str] = []
    for d in declared(type(instance)):
        value = getattr(instance, d.name)
        if not d.takes({role}) or value is None or (d.kind is tuple and not value):
            continue
        if d.kind is bool:
            argv += [d.flag] if value else []
        else:
            argv += [d.flag, d.render(value)]
    return argv


def to_environ(instance: Any, role: str) -> dict[str, str]:
    """``PS_*`` variables that give a ``role`` process the settings of ``instance`` (unset
    optional values, empty lists and false switches left out, as in :func:`to_argv`)."""
    env = {}
    for d in declared(type(instance)):
        value = getattr(instance, d.name)
        if d.takes({role}) and value is not None and not (d.kind in (tuple, bool) and not value):
            env[d.env] = d.render(value)
    return env


def parse_int_list(text: str) -> tuple[int, ...]:
    """``"0,1,5"`` (or ``""``) as a tuple of ints; ``ConfigError`` otherwise."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise ConfigError(f"expected comma-separated integers, got {text!r}") from None


def parse_value(d: Declared, text: str) -> Any:
    """The value of setting ``d`` written as ``text`` (a flag's or a variable's)."""
    if d.optional and text == "":
        return None
    try:
        if d.kind is tuple:
            return parse_int_list(text)
        if d.kind is bool:
            if text.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off", ""):
                raise ValueError(text)
            return text.lower() in ("1", "true", "yes", "on")
        return d.kind(text)
    except ValueError:
        raise ConfigError(f"{d.env} ({d.flag}): cannot read {text!r} as "
                          f"{d.kind.__name__}") from None


def from_environ(cls: type, env: Mapping[str, str], roles: Iterable[str], **fixed: Any) -> Any:
    """An instance of ``cls`` from ``PS_*`` variables (those its ``roles`` take)."""
    kwargs = {d.name: parse_value(d, env[d.env]) for d in declared(cls)
              if d.takes(roles) and d.env in env}
    return construct(cls, {**kwargs, **fixed})


def check_ranges(instance: Any) -> None:
    """``ConfigError`` naming the flag of the first value outside its choices or range."""
    for d in declared(type(instance)):
        check_value(d, getattr(instance, d.name))


def check_value(d: Declared, value: Any, name: str | None = None) -> None:
    """``ConfigError`` if ``value`` is outside the choices or the range of setting ``d``;
    the message names it ``name`` (default: its flag)."""
    if value is None:
        return
    name = name or d.flag
    choices = d.choices
    if choices is not None and value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    low, high = d.spec.minimum, d.spec.maximum
    for v in value if d.kind is tuple else (value,):
        if (low is not None and v < low) or (high is not None and v > high):
            raise ConfigError(f"{name} must be {_bounds_text(low, high)}, got {v!r}")


def _bounds_text(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"in [{low:g}, {high:g}]"
    return f">= {low:g}" if low is not None else f"<= {high:g}"


def hashed_values(instance: Any) -> dict[str, Any]:
    """Field name -> value of the settings of ``instance`` that enter the run hash, as
    they travel (msgpack, JSON): a tuple as a list."""
    return {d.name: _as_sent(getattr(instance, d.name))
            for d in declared(type(instance)) if d.spec.hashed}


def _as_sent(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def hash_input(instance: Any) -> dict[str, Any]:
    """:func:`hashed_values`, less the settings declared ``hash_default=False`` that are at
    their default: what the run hash is computed from."""
    return {d.name: getattr(instance, d.name) for d in declared(type(instance))
            if d.spec.hashed and (d.spec.hash_default or getattr(instance, d.name) != d.default)}


def markdown_table(classes: Sequence[type], roles: Iterable[str] | None = None) -> str:
    """A markdown table of the settings of ``classes`` (for the README)."""
    rows = ["| flag | variable | default | taken by | |", "|---|---|---|---|---|"]
    wanted = set(roles or ALL_ROLES)
    for cls in classes:
        for d in declared(cls):
            if not d.takes(wanted):
                continue
            default = "required" if d.spec.required else (
                "–" if d.default is None or d.default == () else f"`{d.render(d.default)}`")
            if d.kind is bool:
                default = "off"
            taken = ", ".join(r for r in ALL_ROLES if r in d.roles)
            text = d.spec.help.replace("|", "\\|")
            if d.spec.hashed:
                text += " *(run hash)*"
            rows.append(f"| `{d.flag}` | `{d.env}` | {default} | {taken} | {text} |")
    return "\n".join(rows)
