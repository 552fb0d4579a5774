"""Dependence runs one way: ps/ above server/ and worker/, both above common/.

The contracts are in ``pyproject.toml`` (``[tool.importlinter]``) and CI runs
``lint-imports``; this test runs them too, so ``python3 -m pytest`` catches a new
import against them. What the contracts cannot see (an import made at run time, by
name) is checked by importing each command's module in a fresh interpreter and
listing the packages it loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_import_contracts_hold() -> None:
    pytest.importorskip("importlinter")
    # its own process: lint-imports configures logging, which would silence this one's
    run = subprocess.run([sys.executable, "-c", LINT, "--no-cache", "--no-logo"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"lint-imports: a contract is broken:\n{run.stdout}"


LINT = "import sys; from importlinter.cli import lint_imports_command; lint_imports_command()"


def loaded_packages(module: str) -> set[str]:
    """The project's top-level packages (and ps's subpackages) ``import module`` loads."""
    code = (f"import sys, json; import {module}; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('common', 'server', 'worker', 'ps'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=120).stdout
    names = json.loads(out)
    return {".".join(n.split(".")[:2]) if n.startswith("ps.") else n.split(".")[0]
            for n in names}


@pytest.mark.parametrize(("module", "absent"), [
    ("server.cli", {"ps", "worker"}),
    ("worker.cli", {"ps", "server"}),
    ("ps.proxy.cli", {"server", "worker", "ps.launcher", "ps.reference"}),
])
def test_a_command_loads_no_other_commands_settings(module: str, absent: set[str]) -> None:
    """The one table of commands (``common.run.commands``) names the settings classes of
    the layers above by path: a role's command imports its own and no other's."""
    loaded = loaded_packages(module)
    assert not loaded & absent, f"import {module} loaded {sorted(loaded & absent)}"


def test_a_run_file_key_of_another_command_is_still_accepted(tmp_path: Path) -> None:
    """A run file serves every command: ps-server takes a key only ps-cluster has
    (``start``), resolved from the table when the file is read."""
    from click.testing import CliRunner

    from server.cli import main

    run_file = tmp_path / "run.toml"
    run_file.write_text('start = "exec"\nrule = "meamed"\n', encoding="utf-8")
    result = CliRunner().invoke(main, ["--config", str(run_file), "--print-config"])
    assert result.exit_code == 0, result.output
    assert 'rule = "meamed"' in result.output
    typo = tmp_path / "typo.toml"
    typo.write_text('strat = "exec"\n', encoding="utf-8")
    result = CliRunner().invoke(main, ["--config", str(typo), "--print-config"])
    assert result.exit_code != 0 and "did you mean start" in result.output
