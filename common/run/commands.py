"""Which settings each command takes: the one table, read by everything that lists them.

Each command of the system names here, once, the roles it serves and the settings
classes it takes (in its ``--help`` order). A class of a layer above ``common`` (the
server's, the worker's, the launcher's, the proxy's, the reference engine's options) is
named by its dotted path and imported when a command asks for its classes: so
``import server.cli`` loads the server's settings and no other command's, and a run
file's keys (``common.conf.runfile``: one file serves every command) are checked against
every command's settings only when a file is read. From this table come

* each command's click options (``common.run.cli.settings_command``: ``server/cli.py``,
  ``worker/cli.py``, ``ps/proxy/cli.py``, ``ps/launcher/cli.py``, ``ps/reference/cli.py``,
  ``ps/experiments/cli.py``);
* the flags ``ps-cluster`` hands each child (``ps.launcher.argv``: the child's command
  is the one that serves its role) and the ``ps-cluster`` flags of ``command.json``;
* the environment of each compose or stack service (``ps.deploy.compose``) and which
  ``PS_*`` keys an env file may hold;
* the README's settings table (``scripts/gen_docs.py``), whose test checks that every
  flag of every command is in it.

``AttackConfig`` stands for the scenario and every registered attack's parameter
class (its ``params``), read when a command is built: an attack added in one file is
taken by every command that takes ``AttackConfig``.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

from common.conf.settings import (
    CLUSTER,
    EVALUATOR,
    EXPERIMENT,
    PROXY,
    SERVER,
    SIMULATE,
    WORKER,
    Command,
)
from common.learn.attacks import ATTACKS
from common.net.keys import SecurityOptions
from common.run.config import AttackConfig, RunConfig
from common.run.process import ProcessOptions

# The settings classes of the layers above common, by dotted path ``module:Class``.
ServerOptions = "server.options:ServerOptions"
ClientOptions = "worker.options:ClientOptions"
EvalOptions = "worker.options:EvalOptions"
ClusterOptions = "ps.launcher.options:ClusterOptions"
ProxyOptions = "ps.proxy.options:ProxyOptions"
ReplayOptions = "ps.reference.options:ReplayOptions"


@functools.cache
def settings_class(path: str) -> type:
    """The class a dotted path ``module:Class`` of the table names, imported."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _taking(*classes: type | str) -> Callable[[], tuple[type, ...]]:
    """``classes`` (a dotted path imported when first read), ``AttackConfig`` followed by
    the attacks registered when read."""

    def now() -> tuple[type, ...]:
        found = [settings_class(c) if isinstance(c, str) else c for c in classes]
        attacks: tuple[type, ...] = tuple(ATTACKS.values())
        return tuple(c for cls in found
                     for c in ((cls, *attacks) if cls is AttackConfig else (cls,)))

    return now


COMMANDS: dict[str, Command] = {c.name: c for c in (
    Command("ps-server", frozenset({SERVER}),
            _taking(ServerOptions, RunConfig, SecurityOptions, ProcessOptions)),
    Command("ps-worker", frozenset({WORKER, EVALUATOR}),
            _taking(ClientOptions, EvalOptions, AttackConfig, RunConfig, SecurityOptions,
                    ProcessOptions)),
    Command("ps-proxy", frozenset({PROXY}),
            _taking(ProxyOptions, AttackConfig, RunConfig, SecurityOptions, ProcessOptions)),
    Command("ps-cluster", frozenset({CLUSTER}),
            _taking(ClusterOptions, ClientOptions, EvalOptions, ServerOptions, AttackConfig,
                    RunConfig, SecurityOptions, ProcessOptions)),
    Command("ps-simulate", frozenset({SIMULATE}),
            _taking(ClientOptions, EvalOptions, ReplayOptions, AttackConfig, RunConfig,
                    ProcessOptions)),
    # the run settings a grid does not vary; its own options are ps/experiments/cli.py's
    Command("ps-experiment", frozenset({EXPERIMENT}),
            _taking(RunConfig, ClientOptions, EvalOptions),
            unset={"model": "the dataset's recipe", "rounds": "the grid's recipe"}),
)}
# The commands a deployment's containers run (what an env file may set).
DEPLOYED = ("ps-server", "ps-proxy", "ps-worker")


def command_of(role: str) -> Command:
    """The command whose processes serve ``role`` (``ps-worker`` for the evaluator)."""
    serving = [c for c in COMMANDS.values() if role in c.roles]
    if len(serving) != 1:
        raise KeyError(f"role {role!r} is served by {len(serving)} commands")
    return serving[0]


def setting_classes(commands: tuple[str, ...] = tuple(COMMANDS)) -> tuple[type, ...]:
    """Every class whose settings ``commands`` take, each once, in table order."""
    return tuple(dict.fromkeys(c for name in commands for c in COMMANDS[name].classes()))
