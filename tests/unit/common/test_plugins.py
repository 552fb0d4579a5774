"""Plugins without processes: dotted paths checked and registered, installed packages'
entry points registered with their version in the run hash, ps-list showing both."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from common.errors import ConfigError
from common.learn.rules import RULES, Rule
from common.run import plugins
from common.run.config import RunConfig

EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples"


class Halved(Rule):
    name = "halved-mean"
    summary = "half the mean (a test's)"

    def aggregate(self, G):
        return G.mean(0) / 2


class _Dist:
    name, version = "halving", "1.2.3"


class _EntryPoint:
    name, value, dist = "halved", "halving:Halved", _Dist()

    def load(self):
        return Halved


@pytest.mark.parametrize(("path", "ok"), [
    ("pkg.mod:Name", True), ("mod:Name", True), ("mod", False), ("mod:", False),
    (":Name", False), ("mod:Name:x", False), ("a b:C", False), ("../x:C", False)])
def test_a_plugin_is_named_by_a_dotted_path(path: str, ok: bool) -> None:
    assert plugins.is_plugin_path(path) is ok


def test_an_entry_point_registers_a_rule_with_its_version_in_the_hash(monkeypatch) -> None:
    def installed(group: str) -> list[_EntryPoint]:
        return [_EntryPoint()] if group == "byzps.rules" else []

    monkeypatch.setattr(plugins, "_installed_entry_points", installed)
    plugins.load_entry_points("rules")
    try:
        assert RULES["halved"] is Halved
        cfg = RunConfig(dataset="synthetic", rule="halved", q=0).validate()
        assert cfg.plugins() == ["halved halving==1.2.3"]
        assert cfg.config_hash != RunConfig(dataset="synthetic", rule="mean",
                                            q=0).validate().config_hash
    finally:
        del RULES["halved"]
        plugins.FINGERPRINTS.pop("halved", None)


def test_the_built_ins_hash_as_before() -> None:
    cfg = RunConfig(dataset="synthetic").validate()
    assert cfg.plugins() == [] and "plugins" not in cfg.to_dict()


def test_a_dotted_path_is_refused_with_one_line_naming_what_is_wrong(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    with pytest.raises(ConfigError, match="my_defences has no 'Nothing'"):
        plugins.load("rules", "my_defences:Nothing")
    with pytest.raises(ConfigError, match=r"is not a subclass of common\.learn\.rules\.base\.Rule"):
        plugins.load("rules", "my_defences:ScaledMean")  # an attack, not a rule
    with pytest.raises(ConfigError, match="not a rule, pre-aggregator, attack"):
        plugins.load_any("my_defences:scaled_mean")  # a function


def test_ps_list_shows_a_plugin_with_its_options(monkeypatch) -> None:
    from ps.list_cli import main

    monkeypatch.syspath_prepend(str(EXAMPLES))
    try:
        result = CliRunner().invoke(main, ["attacks", "--plugin", "my_defences:ScaledMean"])
        assert result.exit_code == 0, result.output
        assert "my_defences:ScaledMean" in result.output
        assert "--scaled-mean-factor (PS_SCALED_MEAN_FACTOR, default -4.0)" in result.output
        bad = CliRunner().invoke(main, ["--plugin", "my_defences:nothing"])
        assert bad.exit_code == 2 and "has no 'nothing'" in bad.output
    finally:
        from common.learn.attacks import ATTACKS

        ATTACKS._items.pop("my_defences:ScaledMean", None)
        plugins.FINGERPRINTS.pop("my_defences:ScaledMean", None)
        sys.modules.pop("my_defences", None)


def test_a_compose_env_file_may_name_a_plugin_and_its_options(monkeypatch) -> None:
    from ps.deploy.compose import deployment, read_env

    monkeypatch.syspath_prepend(str(EXAMPLES))
    root = EXAMPLES.parents[1]
    env = {**read_env(root / "docker" / "cluster.env"), "PS_PROXY_ATTACK": "none",
           "PS_WORKER_ATTACK": "my_defences:ScaledMean", "PS_SCALED_MEAN_FACTOR": "-2"}
    try:
        dep = deployment(env, {"proxy_shards": [], "byzantine_workers": [0],
                               "worker_attack": "my_defences:ScaledMean"})
        assert dep.attack.params["my_defences:ScaledMean"].factor == -2.0
    finally:
        from common.learn.attacks import ATTACKS

        ATTACKS._items.pop("my_defences:ScaledMean", None)
        plugins.FINGERPRINTS.pop("my_defences:ScaledMean", None)
        sys.modules.pop("my_defences", None)
