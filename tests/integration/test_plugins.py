"""A user's own rule and attack, in a module of their own directory (outside the package),
named by dotted path: through ps-simulate, ps-cluster --verify (real processes, forked
and executed) and an experiment grid; a node without the plugin, or with a broken one,
refuses to start with one line; the run hash covers the plugin's code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from common.errors import EXIT_CONFIG

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "my_defences.py"
RULE, ATTACK = "my_defences:MedianOfMeans", "my_defences:ScaledMean"
RUN = ["--dataset", "synthetic", "--workers", "5", "--q", "1", "--rounds", "6",
       "--eval-every", "3", "--rule", RULE, "--worker-attack", ATTACK,
       "--byzantine-workers", "0", "--scaled-mean-factor", "-3", "--mom-group", "3"]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """The user's directory, holding their module (not on the package's path)."""
    shutil.copy(EXAMPLE, tmp_path / EXAMPLE.name)
    return tmp_path


def _run(home: Path, module: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the package; the plugin is in cwd
    return subprocess.run([sys.executable, "-m", module, *args], cwd=home, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("start", [
    "fork",  # ps-cluster's default
    # every role a fresh interpreter importing the plugin (one process each will do): the
    # harder case, and the longer run; with the long scenarios (-m scenario)
    pytest.param("exec", marks=pytest.mark.scenario)])
def test_a_users_rule_and_attack_run_through_simulate_and_the_cluster(home: Path,
                                                                      start: str) -> None:
    simulated = _run(home, "ps.reference.cli", *RUN, "--out-dir", str(home / "sim"))
    assert simulated.returncode == 0, simulated.stderr
    config = json.loads((home / "sim" / "config.json").read_text())
    assert config["run"]["rule"] == RULE and config["attack"]["worker_attack"] == ATTACK
    assert config["attack"]["params"]["my_defences:ScaledMean"]["factor"] == -3.0
    assert config["run"]["mom_group"] == 3  # the rule's own option, a run setting
    layout = ["--server-processes", "1", "--worker-processes", "1"] if start == "exec" else []
    out = home / f"cluster-{start}"
    cluster = _run(home, "ps.launcher.cli", *RUN, "--shards", "3", "--start", start,
                   *layout, "--verify", "--out-dir", str(out))
    assert cluster.returncode == 0, cluster.stderr[-3000:]
    assert "verified: the reference engine ends with the same parameters" in (
        cluster.stdout + cluster.stderr)
    assert (json.loads((out / "summary.json").read_text())["params_sha256"]
            in simulated.stdout)


def test_a_grid_compares_a_users_rule_with_the_built_ins(home: Path) -> None:
    (home / "grid.toml").write_text(
        f'dataset = "synthetic"\nworkers = 5\nq = 1\nrounds = 4\neval-every = 2\n'
        f'rule = ["marmed", "{RULE}"]\nworker-attack = "{ATTACK}"\n'
        f'byzantine-workers = [0]\nseeds = 1\n', encoding="utf-8")
    result = _run(home, "ps.experiments.cli", "run", "grid.toml", "--out", "out",
                  "--jobs", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (home / "out" / "results.jsonl").open()]
    assert {r["rule"] for r in rows} == {"marmed", RULE}


def test_a_node_without_the_plugin_refuses_to_start_with_one_line(home: Path) -> None:
    result = _run(home, "server.cli", "--rule", "no_such_module:Rule", "--insecure")
    assert result.returncode == EXIT_CONFIG
    lines = [line for line in result.stderr.splitlines() if "no_such_module" in line]
    assert len(lines) == 1 and "cannot import no_such_module" in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("body", "needle"), [
    ("class Rule:\n    summary = 'not one'\n", "is not a subclass of common.learn.rules.base.Rule"),
    ("from common.learn.rules import Rule as R\nclass Rule(R):\n    name = 'bad'\n"
     "    summary = 'returns a row per input'\n"
     "    def aggregate(self, G):\n        return G\n",
     "fails on a test matrix of 5 rows: RuleError: rule bad returned (5, 64)"),
    ("raise RuntimeError('broken at import')\n", "RuntimeError: broken at import"),
    ("from common.learn.rules import Rule as R\nclass Rule(R):\n    name = 'bad'\n"
     "    summary = 'cannot be built'\n"
     "    def __init__(self, n, q, **options):\n        raise ValueError('no way')\n",
     "fails on a test matrix of 5 rows: ValueError: no way"),
])
def test_a_broken_plugin_is_refused_at_start(home: Path, body: str, needle: str) -> None:
    (home / "broken.py").write_text(body, encoding="utf-8")
    result = _run(home, "ps.reference.cli", "--dataset", "synthetic", "--workers", "5",
                  "--rounds", "2", "--rule", "broken:Rule")
    assert result.returncode == EXIT_CONFIG, result.stderr
    assert needle in result.stderr and "Traceback" not in result.stderr


def test_the_run_hash_covers_the_plugins_code(home: Path) -> None:
    code = ("from common.run import plugins; plugins.load('rules', 'my_defences:MedianOfMeans');"
            "from common.run.config import RunConfig;"
            "print(RunConfig(dataset='synthetic', rule='my_defences:MedianOfMeans', q=1)"
            ".validate().config_hash)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def hash_in(where: Path) -> str:
        return subprocess.run([sys.executable, "-c", code], cwd=where, env=env, check=True,
                              capture_output=True, text=True).stdout.strip()

    other = home / "other"
    other.mkdir()
    shutil.copy(home / EXAMPLE.name, other / EXAMPLE.name)
    assert hash_in(home) == hash_in(other)  # the same code: the same run
    with (other / EXAMPLE.name).open("a", encoding="utf-8") as f:
        f.write("\n# another version\n")
    assert hash_in(home) != hash_in(other)
