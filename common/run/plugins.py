"""Rules, pre-aggregators, attacks, models and datasets from outside this package.

Wherever one is named (``--rule``, ``--pre``, ``--worker-attack``, ``--proxy-attack``,
``--model``, ``--dataset``, their ``PS_*`` variables, a ``--config`` file, a grid
file), a dotted path ``package.module:Name`` names the user's own: the module is
imported and ``Name`` registered under that path, as a built-in registers itself
(a rule, pre-aggregator or attack class deriving from ``Rule``, ``PreAggregator``,
``Attack``; a ``ModelSpec``; a ``DatasetSpec``). Installed packages can also register
names through the entry-point groups ``byzps.rules``, ``byzps.pre``, ``byzps.attacks``,
``byzps.models`` and ``byzps.datasets``.

Importing a module loads no plugin: each command calls :func:`load_plugins` once when
it starts (``common.run.cli.SettingsCommand``), before it builds its options, so a
plugin's settings (an attack's parameters, a rule's declared options) become flags,
``PS_*`` variables and help like the built-ins'; a process that runs a run without a
command line (an experiment's cell) calls it with the run's settings.

A run's configuration hash covers each plugin it names (its dotted path or
entry-point name, with its package's version or its source file's SHA-256):
a node with another version refuses the handshake, and a node without the plugin
refuses to start with one line naming what it cannot import (exit 2).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import os
import re
import sys
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from common.errors import ConfigError

GROUPS = {"rules": "byzps.rules", "pre": "byzps.pre", "attacks": "byzps.attacks",
          "models": "byzps.models", "datasets": "byzps.datasets"}
# The settings that name something, by parameter (flag) name, and what they name.
NAMING = {"rule": "rules", "pre": "pre", "worker_attack": "attacks",
          "proxy_attack": "attacks", "model": "models", "dataset": "datasets"}
_PATH = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*", re.ASCII)
# name -> its fingerprint ("path sha256:..." or "dist==version"), for the run hash
FINGERPRINTS: dict[str, str] = {}
# dotted path -> the kind it was loaded as, in this process (handed to its children)
LOADED: dict[str, str] = {}


def is_plugin_path(name: str) -> bool:
    """Whether ``name`` is a dotted path ``package.module:Name``."""
    return isinstance(name, str) and _PATH.fullmatch(name) is not None


def load(kind: str, path: str) -> None:
    """Import ``package.module:Name`` and register it among ``kind`` under ``path``
    (once); ``ConfigError`` of one line naming what is missing or wrong."""
    registry = _registry(kind)
    if path in registry:
        return
    module_name, _, attr = path.partition(":")
    if os.getcwd() not in sys.path:  # a module in the current directory, as python -m finds
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module: any error of theirs is a refusal
        raise ConfigError(f"plugin {path}: cannot import {module_name} ({type(exc).__name__}: "
                          f"{exc}); is it on PYTHONPATH or installed on this node?") from None
    item = getattr(module, attr, None)
    if item is None:
        raise ConfigError(f"plugin {path}: {module_name} has no {attr!r}")
    _check(kind, path, item)
    registry.add(path, item)
    FINGERPRINTS[path] = f"{path} sha256:{_source_digest(module)}"
    LOADED[path] = kind


def load_again(loaded: Mapping[str, str]) -> None:
    """In a new process (a pool's): the installed packages' plugins and the dotted paths
    its parent had loaded (``LOADED``), so that it knows every setting the parent did."""
    for kind in GROUPS:
        load_entry_points(kind)
    for path, kind in loaded.items():
        load(kind, path)


def load_any(path: str) -> str:
    """Load ``package.module:Name`` as whatever it is (a rule, a pre-aggregator, an
    attack, a model or a dataset); the kind; ``ConfigError`` if it is none of them."""
    for kind in GROUPS:
        try:
            load(kind, path)
            return kind
        except ConfigError as exc:
            if "cannot import" in str(exc) or "has no" in str(exc):
                raise
    raise ConfigError(f"plugin {path}: not a rule, pre-aggregator, attack, model or "
                      f"dataset (a subclass of Rule, PreAggregator or Attack, a ModelSpec "
                      f"or a DatasetSpec, with a summary)")


def load_entry_points(kind: str) -> None:
    """Register the ``byzps.<kind>`` entry points of the installed packages (a broken
    one is refused with one line naming it)."""
    registry = _registry(kind)
    for ep in _installed_entry_points(GROUPS[kind]):
        if ep.name in registry:
            continue
        try:
            item = ep.load()
        except Exception as exc:
            raise ConfigError(f"entry point {GROUPS[kind]}:{ep.name} ({ep.value}): "
                              f"{type(exc).__name__}: {exc}") from None
        _check(kind, ep.name, item)
        registry.add(ep.name, item)
        dist = ep.dist
        FINGERPRINTS[ep.name] = (f"{ep.name} {dist.name}=={dist.version}" if dist else
                                 f"{ep.name} {ep.value}")


def load_plugins(values: Mapping[str, Any]) -> None:
    """Register every plugin a command may use: the installed packages' entry points,
    then the dotted paths the naming settings of ``values`` give (by parameter name, as
    :func:`scan_argv` finds them); ``ConfigError`` for one that cannot be loaded."""
    for kind in GROUPS:
        load_entry_points(kind)
    load_named(values)


def load_named(values: Mapping[str, Any]) -> None:
    """Load the plugins that the naming settings in ``values`` (by parameter name: rule,
    pre, worker_attack, ...) name by dotted path (``pre``: a comma-separated chain)."""
    for param, kind in NAMING.items():
        value = values.get(param)
        if not isinstance(value, str):
            continue
        for name in value.split(",") if param == "pre" else [value]:
            if is_plugin_path(name.strip()):
                load(kind, name.strip())


def scan_argv(argv: list[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The naming settings a command line and environment give, by parameter name (what
    must be loaded before the command's options are built); a ``--config`` file's too."""
    found: dict[str, str] = {}
    config = environ.get("PS_CONFIG")
    for i, arg in enumerate(argv):
        flag, eq, inline = arg.partition("=")
        value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else None)
        if flag == "--config" and value:
            config = value
    if config:
        from common.conf.runfile import read_run_file

        try:
            table = read_run_file(Path(config))
        except ConfigError:
            table = {}  # the command refuses it itself, with the file's error
        found.update({k.replace("-", "_"): v for k, v in table.items()
                      if k.replace("-", "_") in NAMING and isinstance(v, str)})
    for param in NAMING:
        env = environ.get("PS_" + param.upper())
        if env:
            found[param] = env
    for i, arg in enumerate(argv):
        flag, eq, inline = arg.partition("=")
        param = flag.removeprefix("--").replace("-", "_")
        if flag.startswith("--") and param in NAMING:
            value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else None)
            if value is not None:
                found[param] = value
    return found


@functools.cache
def _installed_entry_points(group: str) -> metadata.EntryPoints:
    """The installed packages' entry points of ``group``, read once per process."""
    return metadata.entry_points(group=group)


def fingerprints(names: Iterable[str]) -> list[str]:
    """The fingerprints of the plugins among ``names`` (built-ins have none)."""
    return sorted({FINGERPRINTS[n] for n in names if n in FINGERPRINTS})


def _registry(kind: str) -> Any:
    if kind == "rules":
        from common.learn.rules import RULES
        return RULES
    if kind == "pre":
        from common.learn.rules.pre import PRE_AGGREGATORS
        return PRE_AGGREGATORS
    if kind == "attacks":
        from common.learn.attacks import ATTACKS
        return ATTACKS
    if kind == "models":
        from common.learn.models import MODELS
        return MODELS
    if kind == "datasets":
        from common.learn.data import DATASETS
        return DATASETS
    raise KeyError(kind)


def _check(kind: str, path: str, item: Any) -> None:
    """``ConfigError`` unless ``item`` is what ``kind`` registers."""
    from common.learn.attacks import Attack
    from common.learn.data.base import DatasetSpec
    from common.learn.models import ModelSpec
    from common.learn.rules import Rule
    from common.learn.rules.pre import PreAggregator

    expected: type = {"rules": Rule, "pre": PreAggregator, "attacks": Attack,
                      "models": ModelSpec}.get(kind, DatasetSpec)
    ok = (isinstance(item, expected) if kind in ("models", "datasets") else
          inspect.isclass(item) and issubclass(item, expected) and item is not expected)
    if not ok:
        what = "an instance of" if kind in ("models", "datasets") else "a subclass of"
        raise ConfigError(f"plugin {path}: {item!r} is not {what} {expected.__module__}."
                          f"{expected.__name__}")
    if not getattr(item, "summary", ""):
        raise ConfigError(f"plugin {path}: it has no one-line summary (the attribute "
                          f"'summary', shown by ps-list)")


def _source_digest(module: Any) -> str:
    """SHA-256 of the module's source file (its code: a node with other code differs)."""
    try:
        return hashlib.sha256(Path(inspect.getfile(module)).read_bytes()).hexdigest()[:16]
    except (OSError, TypeError):
        return "unknown"
