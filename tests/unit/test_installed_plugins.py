"""Installed packages' plugins (entry points), loaded when a command starts, reach every
command that names things: ``ps-experiment``'s choices, the compose generator's env
file, a grid cell's cache key (unchanged by a plugin merely loaded), and a plugin that
cannot be loaded is refused before its own flags are parsed."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from click.testing import CliRunner

from common.learn.rules import RULES
from common.run import plugins
from common.run.config import RunConfig

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"


@pytest.fixture
def installed(monkeypatch):
    """Entry points as an installed package would list them: a rule ``mom`` (the example
    plugin's)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    listed = {"byzps.rules": [metadata.EntryPoint("mom", "my_defences:MedianOfMeans",
                                                  "byzps.rules")]}
    monkeypatch.setattr(plugins, "_installed_entry_points",
                        lambda group: metadata.EntryPoints(listed.get(group, [])))
    yield
    RULES._items.pop("mom", None)
    plugins.FINGERPRINTS.pop("mom", None)
    sys.modules.pop("my_defences", None)


def test_ps_experiment_takes_an_installed_model(tmp_path) -> None:
    """A package installed where Python finds it (its ``dist-info`` lists a
    ``byzps.models`` entry point): ``ps-experiment`` takes its model, in its own
    process and in the cells' spawned ones."""
    site = tmp_path / "site"
    (site / "tiny_models-1.0.dist-info").mkdir(parents=True)
    (site / "tiny_models-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tiny-models\nVersion: 1.0\n", encoding="utf-8")
    (site / "tiny_models-1.0.dist-info" / "entry_points.txt").write_text(
        "[byzps.models]\ntiny = tiny_models:tiny\n", encoding="utf-8")
    (site / "tiny_models.py").write_text(
        "from common.learn.models import MODELS\ntiny = MODELS['mlp']\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    result = subprocess.run(
        [sys.executable, "-m", "ps.experiments.cli", "paper", "--out", str(tmp_path / "out"),
         "--model", "tiny", "--dataset", "synthetic", "--rounds", "1", "--seeds", "1",
         "--rules", "marmed", "--scenarios", "none", "--no-sweeps", "--jobs", "1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_compose_generator_takes_an_installed_rule(installed) -> None:
    from ps.deploy.compose import deployment

    env = {"PS_RULE": "mom", "PS_WORKERS": "5", "PS_SHARDS": "1", "PS_DATASET": "synthetic"}
    dep = deployment(env, {"byzantine_workers": [], "proxy_shards": [], "experiment": None,
                           "worker_attack": "gaussian"})
    assert dep.cfg.rule == "mom"


def test_a_cells_key_does_not_change_when_a_plugin_is_loaded(monkeypatch) -> None:
    from ps.experiments.grid import Cell

    run = {"dataset": "synthetic", "num_workers": 5, "rule": "marmed", "seed": 0, "rounds": 3}
    before = Cell("paper", "none", run, {}).key
    monkeypatch.syspath_prepend(str(EXAMPLES))
    try:
        plugins.load("rules", "my_defences:MedianOfMeans")
        assert Cell("paper", "none", run, {}).key == before
    finally:
        RULES._items.pop("my_defences:MedianOfMeans", None)
        plugins.FINGERPRINTS.pop("my_defences:MedianOfMeans", None)
        plugins.LOADED.pop("my_defences:MedianOfMeans", None)
        sys.modules.pop("my_defences", None)


def test_a_plugin_option_given_twice_keeps_the_later_value(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    try:
        plugins.load("rules", "my_defences:MedianOfMeans")
        first = RunConfig.from_settings(dataset="synthetic", mom_group=3)
        again = RunConfig.from_settings(dataset="synthetic",
                                        plugin_options=first.plugin_options, mom_group=5)
        assert (first.mom_group, again.mom_group) == (3, 5)
        default = next(d.default for d in RunConfig.extra_settings() if d.name == "mom_group")
        assert RunConfig.from_settings(mom_group=default) == RunConfig()  # hash alike: equal
    finally:
        RULES._items.pop("my_defences:MedianOfMeans", None)
        plugins.FINGERPRINTS.pop("my_defences:MedianOfMeans", None)
        plugins.LOADED.pop("my_defences:MedianOfMeans", None)
        sys.modules.pop("my_defences", None)


def test_a_plugin_that_cannot_be_loaded_is_refused_before_its_flags(tmp_path) -> None:
    from ps.reference.cli import main

    result = CliRunner().invoke(main, ["--rule", "no_such_module:Rule", "--mom-group", "3",
                                       "--print-config"])
    assert result.exit_code == 2
    assert "cannot import no_such_module" in result.output
    assert "No such option" not in result.output
