"""Importing a module does nothing but define things.

No module reads ``sys.argv``, the environment or the installed entry points when it is
imported; plugins are loaded by one explicit call when a command starts
(``common.run.plugins.load_plugins``); and the registries and ``RunConfig`` give the same
answer whatever order their modules are imported in. Each case runs in a fresh
interpreter, since this one has imported everything already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"
PLUGIN_RULE = "my_defences:MedianOfMeans"

# What a process knows after its imports: the registries' names, RunConfig's fields and
# its settings' flags, and the plugins loaded.
REPORT = """
import dataclasses, json, sys
from common.run import plugins
from common.learn.attacks import ATTACKS
from common.run.config import RunConfig
from common.learn.data import DATASETS
from common.learn.models import MODELS
from common.learn.rules import RULES
from common.learn.rules.pre import PRE_AGGREGATORS
from common.conf.settings import declared
print(json.dumps({
    "registries": [list(r) for r in (RULES, PRE_AGGREGATORS, ATTACKS, MODELS, DATASETS)],
    "fields": [f.name for f in dataclasses.fields(RunConfig)],
    "flags": [d.flag for d in declared(RunConfig)],
    "loaded": sorted(plugins.LOADED), "user_module": "my_defences" in sys.modules,
}))
"""

# A user's module that registers a rule with an option when it is imported.
SELF_REGISTERING = '''
from dataclasses import dataclass
from common.learn.rules import OptionSettings, Rule, register_rule
from common.conf.settings import setting

@register_rule
class Halved(Rule):
    name = "halved"
    summary = "half the mean (a test's)"
    options = ("factor",)

    @dataclass(frozen=True)
    class Settings(OptionSettings):
        factor: float = setting(0.5, "the factor")

    def __init__(self, n, q, factor=0.5):
        super().__init__(n, q)
        self.factor = factor

    def aggregate(self, G):
        return G.mean(0) * self.factor
'''


def run_python(code: str, tmp_path: Path, argv: tuple[str, ...] = (),
               env: dict[str, str] | None = None) -> dict:
    path = os.pathsep.join([str(ROOT), str(EXAMPLES), str(tmp_path)])
    result = subprocess.run([sys.executable, "-c", code, *argv], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": path, **(env or {})},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_importing_every_module_reads_no_argv_environment_or_entry_point(tmp_path) -> None:
    """Every module of the four packages imported with a plugin named on the command line
    and in the environment, and entry points that fail when read: nothing is loaded."""
    code = (
        "import importlib, pkgutil, sys\n"
        "from common.run import plugins\n"
        "def refuse(*a, **k):\n    raise AssertionError('a plugin loaded at import')\n"
        "plugins._installed_entry_points = plugins.load = plugins.load_named = refuse\n"
        "for package in ('common', 'server', 'worker', 'ps'):\n"
        "    root = importlib.import_module(package)\n"
        "    for m in pkgutil.walk_packages(root.__path__, package + '.'):\n"
        "        if not m.name.endswith('__main__'):\n"
        "            importlib.import_module(m.name)\n"
        + REPORT)
    found = run_python(code, tmp_path, argv=("--rule", PLUGIN_RULE, "--config", "x.toml"),
                       env={"PS_RULE": PLUGIN_RULE, "PS_PRE": "my_defences:Nothing"})
    assert found["loaded"] == [] and not found["user_module"]
    assert PLUGIN_RULE not in found["registries"][0]


@pytest.mark.parametrize("first", [
    [],
    ["common.run.cli"],
    ["common.learn.data", "common.learn.models", "common.learn.attacks",
     "common.learn.rules.pre", "common.learn.rules"],
    ["server.cli", "worker.cli"],
    ["ps.launcher.cli", "ps.experiments.cli"],
    ["halving"],  # a user's module registering a rule with an option, first of all
])
def test_the_registries_and_run_config_do_not_depend_on_import_order(first, tmp_path) -> None:
    (tmp_path / "halving.py").write_text(SELF_REGISTERING, encoding="utf-8")
    imports = "".join(f"import {m}\n" for m in first)
    baseline = run_python("import halving\n" + REPORT if first == ["halving"] else REPORT,
                          tmp_path)
    found = run_python(imports + REPORT, tmp_path)
    assert found == baseline
    # the built-ins are fields; the user's rule's option is a setting, never a field
    assert "multikrum_m" in found["fields"] and "factor" not in found["fields"]
    if first == ["halving"]:
        assert found["flags"][-1] == "--factor"


def test_a_plugin_named_on_the_command_line_is_loaded_when_the_command_starts(
        tmp_path) -> None:
    """The one explicit call: ps-simulate's --print-config loads the rule it names and
    takes its option as a flag."""
    code = (
        "import sys\n"
        "from ps.reference.cli import main\n"
        "sys.argv[1:] = ['--rule', '" + PLUGIN_RULE + "', '--mom-group', '3', "
        "'--dataset', 'synthetic', '--print-config']\n"
        "main(standalone_mode=False)\n" + REPORT)
    found = run_python(code, tmp_path)
    assert found["loaded"] == [PLUGIN_RULE] and "--mom-group" in found["flags"]
    assert "mom_group" not in found["fields"]
