"""Settings are declared once: the commands, the child argv, the compose environment and
the README are derived from the declarations, and a new attack or rule needs one file."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import click
import numpy as np
import pytest
from click.testing import CliRunner

from common.conf.runfile import RUN_FILE_FLAGS
from common.conf.settings import (
    ALL_ROLES,
    EVALUATOR,
    PROXY,
    SERVER,
    WORKER,
    Command,
    declared,
    from_environ,
    setting,
    take,
    to_argv,
    to_environ,
)
from common.learn.attacks import ATTACKS, VectorAttack, register_attack
from common.learn.rules import RULES, Rule, register_rule
from common.net.keys import SecurityOptions
from common.run.commands import COMMANDS, command_of
from common.run.config import AttackConfig, RunConfig
from ps.deploy.compose import _environment as compose_environment
from ps.deploy.compose import deployment, service_environments
from ps.experiments.gridfile import INVOCATION
from ps.launcher import cli as cluster_cli
from ps.launcher.argv import child_argv
from ps.launcher.cluster import Cluster, ClusterSpec
from ps.proxy import cli as proxy_cli
from ps.proxy.options import ProxyOptions
from server import cli as server_cli
from server.options import ServerOptions
from worker import cli as worker_cli

ROOT = Path(__file__).resolve().parents[2]
CFG = RunConfig(dataset="synthetic", num_workers=5, num_shards=2, rounds=7, seed=3).validate()
CLI_OF = {SERVER: server_cli, PROXY: proxy_cli, WORKER: worker_cli, EVALUATOR: worker_cli}


@pytest.fixture
def wobble() -> Iterator[type]:
    """A throw-away attack, registered for one test: one file's worth of code."""

    @register_attack
    @dataclass(frozen=True)
    class Wobble(VectorAttack):
        name: ClassVar[str] = "wobble"
        summary: ClassVar[str] = "the honest mean times --wobble-level"

        level: float = setting(3.0, "Wobble: factor on the honest mean.", flag="--wobble-level",
                               minimum=0.0)

        def forge(self, honest, num_byzantine, rng, num_workers):
            return np.tile(honest.mean(0) * np.float32(self.level), (num_byzantine, 1))

    yield Wobble
    del ATTACKS["wobble"]


def test_a_new_attack_appears_in_help_argv_and_compose(wobble: type, tmp_path: Path) -> None:
    help_text = CliRunner().invoke(cluster_cli.build_command(), ["--help"],
                                   terminal_width=200).output
    assert "--wobble-level" in help_text and "PS_WOBBLE_LEVEL" in help_text
    assert "wobble" in help_text.split("\n  --worker-attack ")[1].split("\n")[0]

    attack = AttackConfig.build(worker_attack="wobble", byzantine_workers=(1,),
                                wobble_level=2.5).validate(CFG)
    cluster = Cluster(ClusterSpec(cfg=CFG, attack=attack, out_dir=tmp_path))
    argv = cluster.worker_argv(1, ["tcp://a:1", "tcp://b:2"])
    assert argv[argv.index("--worker-attack") + 1] == "wobble"
    assert argv[argv.index("--wobble-level") + 1] == "2.5"
    assert "--wobble-level" not in cluster.worker_argv(0, ["tcp://a:1", "tcp://b:2"])

    env = {"PS_DATASET": "synthetic", "PS_WORKERS": "5", "PS_SHARDS": "2",
           "PS_WOBBLE_LEVEL": "4"}
    options = {"proxy_shards": [], "byzantine_workers": [1], "worker_attack": "wobble"}
    services = service_environments(deployment(env, options))
    _, worker_env = services["worker-1"]
    assert worker_env["PS_WORKER_ATTACK"] == "wobble" and worker_env["PS_WOBBLE_LEVEL"] == "4.0"
    assert "PS_WORKER_ATTACK" not in services["worker-0"][1]


def test_a_new_rule_is_a_choice_and_is_validated_without_being_built() -> None:
    built = []

    @register_rule
    class Halfway(Rule):
        name = "halfway"
        summary = "half the mean"

        def __init__(self, n: int, q: int) -> None:
            built.append(self)
            super().__init__(n, q)

        def aggregate(self, G):
            return G.mean(0) * 0.5

    try:
        help_text = CliRunner().invoke(server_cli.build_command(), ["--help"],
                                       terminal_width=200).output
        assert "halfway" in help_text.split("\n  --rule ")[1].split("\n")[0]
        assert RunConfig(rule="halfway", num_workers=4).validate().q == 0
        assert built == []  # validation checks preconditions; it builds nothing
    finally:
        del RULES["halfway"]


@pytest.mark.parametrize("role", [SERVER, PROXY, WORKER, EVALUATOR])
def test_child_argv_parses_back_to_the_same_settings(role: str, tmp_path: Path) -> None:
    """What ps-cluster hands a child is read by that child's command as the same values."""
    attack = AttackConfig.build(proxy_attack="bitflip", bitflip_bits=(1, 30), bitflip_coords=9,
                                worker_attack="alie", byzantine_workers=(0, 2),
                                alie_z=0.25).validate(CFG)
    cluster = Cluster(ClusterSpec(cfg=CFG, attack=attack, out_dir=tmp_path))
    ready = tmp_path / "ready"
    argv = {SERVER: lambda: cluster.server_argv(1, ready),
            PROXY: lambda: cluster.proxy_argv(0, "tcp://s:1", ready),
            WORKER: lambda: cluster.worker_argv(2, ["tcp://a:1", "tcp://b:2"]),
            EVALUATOR: lambda: cluster.evaluator_argv(["tcp://a:1", "tcp://b:2"])}[role]()
    command = CLI_OF[role].build_command()
    values = command.make_context(command.name, list(argv)).params
    roles = command_of(role).roles
    assert take(RunConfig, values, roles) == CFG
    if role == WORKER:
        parsed = AttackConfig.build(values, roles)
        assert parsed.worker_attack == "alie" and parsed.byzantine_workers == (0, 2)
        assert parsed.attack("alie") == attack.attack("alie")
    if role == PROXY:
        parsed = AttackConfig.build(values, roles)
        assert parsed.proxy_attack == "bitflip"
        assert parsed.attack("bitflip") == attack.attack("bitflip")


def test_environment_round_trip_for_every_setting_class() -> None:
    attack = AttackConfig.build(gambler_p=0.125, proxy_victims=(1, 3), corrupt_params=True)
    for instance in (CFG, attack, attack.attack("gambler")):
        cls = type(instance)
        back = from_environ(cls, to_environ(instance, "cluster"), {"cluster"})
        for d in declared(cls):
            assert getattr(back, d.name) == getattr(instance, d.name), d.flag


def test_every_flag_and_variable_is_unique_per_command() -> None:
    for module in (server_cli, proxy_cli, worker_cli, cluster_cli):
        command = module.build_command()  # raises on a setting declared twice
        flags = [o for p in command.params for o in p.opts]
        envs = [p.envvar for p in command.params if p.envvar]
        assert len(flags) == len(set(flags)) and len(envs) == len(set(envs)), command.name


def test_argv_leaves_out_unset_values_and_false_switches() -> None:
    assert to_argv(AttackConfig(), WORKER) == ["--worker-attack", "none"]
    assert to_environ(AttackConfig(corrupt_params=True), PROXY) == {
        "PS_PROXY_ATTACK": "none", "PS_CORRUPT_PARAMS": "1"}


def test_readme_tables_are_generated_from_the_declarations() -> None:
    # the script as a command (tests import nothing from scripts/): exit 1 if stale
    check = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--check"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, (
        f"README.md is stale: run python3 scripts/gen_docs.py\n{check.stderr[-2000:]}")


def _entry_points() -> dict[str, click.Command]:
    """Every command of ``[project.scripts]``, as click builds it."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = text.split("[project.scripts]")[1].split("\n[")[0]
    out = {}
    for name, module, attr in re.findall(r'^([\w-]+) = "([\w.]+):(\w+)"$', section, re.M):
        out[name] = getattr(importlib.import_module(module), attr)
    assert "ps-server" in out and "ps-experiment" in out
    return out


def _setting_flags(command: click.Command) -> set[str]:
    """The flags of the settings a command (and its subcommands) shows: the options
    with a PS_* variable."""
    flags = {p.opts[0] for p in command.params if isinstance(p, click.Option) and p.envvar
             and not p.hidden and p.opts[0] not in RUN_FILE_FLAGS}
    for sub in getattr(command, "commands", {}).values():
        flags |= _setting_flags(sub)
    return flags


def test_every_flag_of_every_command_is_in_the_readme_settings_table() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme.split("<!-- generated: settings -->")[1].split("<!-- end: settings -->")[0]
    documented = set(re.findall(r"^\| `(--[a-z0-9-]+)` \|", table, re.M))
    commands = _entry_points()
    assert set(COMMANDS) <= set(commands)
    missing = {name: sorted(_setting_flags(c) - documented) for name, c in commands.items()}
    assert not any(missing.values()), f"flags missing from the README: {missing}"
    assert all(f"`{flag}" in readme for flag in RUN_FILE_FLAGS)  # "In a file"
    shown = set().union(*map(_setting_flags, commands.values()))
    assert {"--keys", "--insecure", "--replay", "--workers", "--eval-every"} <= shown


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_takes_exactly_the_settings_its_table_entry_names(name: str) -> None:
    command = _entry_points()[name]
    # ps-experiment run: a grid file's run settings are in the file, the rest are flags
    own = {("ps-experiment", "run"): INVOCATION.settings(), ("ps-experiment", "grids"): [],
           ("ps-experiment", "report"): [], ("ps-experiment", "compare"): []}
    for sub in getattr(command, "commands", {}).values() or [command]:
        wanted = [d.param for d in own.get((name, sub.name), COMMANDS[name].settings())]
        taken = [p.name for p in sub.params if isinstance(p, click.Option) and p.envvar
                 and p.opts[0] not in RUN_FILE_FLAGS]
        assert taken == wanted, sub.name
        if sub is command and name != "ps-experiment":  # and the run file's two options
            assert {o for p in sub.params for o in p.opts} >= set(RUN_FILE_FLAGS)


def test_every_role_is_served_by_one_command() -> None:
    for role in ALL_ROLES:
        assert role in command_of(role).roles
    assert command_of(EVALUATOR).name == "ps-worker"


def test_a_child_is_handed_only_settings_its_command_takes(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="ps-server takes no settings of ProxyOptions"):
        child_argv(SERVER, CFG, ProxyOptions(server="tcp://s:1"))
    assert child_argv(SERVER, CFG, SecurityOptions(keys=tmp_path))[-2:] == [
        "--keys", str(tmp_path)]
    env = {"PS_DATASET": "synthetic", "PS_WORKERS": "5", "PS_SHARDS": "2",
           "PS_PROXY_ATTACK": "gambler"}
    dep = deployment(env, {"proxy_shards": [0], "byzantine_workers": [], "worker_attack": "x"})
    with pytest.raises(TypeError, match="ps-worker takes no settings of ServerOptions"):
        compose_environment(WORKER, ServerOptions())
    services = service_environments(dep)
    for name in ("server-0", "proxy-0", "worker-1", "evaluator"):
        assert services[name][1]["PS_KEYS"] == "/keys", name


def test_a_command_may_leave_a_setting_to_be_decided_later() -> None:
    """ps-experiment: --rounds and --model default to the grid's recipe, with --help saying so."""
    by_name = {d.name: d for d in COMMANDS["ps-experiment"].settings()}
    assert by_name["rounds"].default is None and by_name["rounds"].optional
    assert by_name["rounds"].shown_default == "the grid's recipe"
    assert by_name["num_workers"].default == 20 and by_name["num_workers"].flag == "--workers"
    broken = Command("ps-x", frozenset({SERVER}), lambda: (RunConfig,), unset={"nope": "?"})
    with pytest.raises(TypeError, match="nope"):
        broken.settings()
