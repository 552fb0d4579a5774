"""Tests import nothing from ``scripts/``: a script is run as a command (a subprocess of
``python3 scripts/NAME.py``), and what a test needs in-process lives in a package
(``ps.chaos`` holds what ``scripts/chaos.py`` runs). And nothing but ``ps.chaos``'s own
modules and the scripts imports ``ps.chaos``.

A line counts as importing from ``scripts/`` when it imports ``scripts`` (``import
scripts``, ``from scripts.x import``), imports a script by its bare name (``from
bench_floor import``, which works only with ``scripts/`` on the path), or puts
``scripts`` on ``sys.path`` (``sys.path.insert``, ``monkeypatch.syspath_prepend``) or
loads a file from it by path (``runpy.run_path``, ``spec_from_file_location``,
``import_module``)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"

SCRIPT_NAMES = sorted(p.stem for p in (ROOT / "scripts").glob("*.py"))
IMPORT = re.compile(
    r"^\s*(?:from|import)\s+(?:scripts\b|(?:" + "|".join(map(re.escape, SCRIPT_NAMES))
    + r")\b)", re.M)
PATH_HOOK = re.compile(r"sys\.path|syspath_prepend|run_path|spec_from_file_location"
                       r"|import_module")
CHAOS = re.compile(r"^\s*(?:from\s+ps\.chaos\b|import\s+ps\.chaos\b|from\s+ps\s+import\s+"
                   r"(?:.*\bchaos\b))", re.M)


def script_imports(text: str) -> list[str]:
    """The lines of ``text`` that import from scripts/ (see the module's docstring)."""
    found = [m.group(0).strip() for m in IMPORT.finditer(text)]
    found += [line.strip() for line in text.splitlines()
              if PATH_HOOK.search(line) and "scripts" in line]
    return found


def test_no_test_imports_from_scripts() -> None:
    offenders = {}
    for path in sorted(TESTS.rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        lines = script_imports(path.read_text(encoding="utf-8"))
        if lines and path != Path(__file__).resolve():
            offenders[name] = lines
    assert not offenders, ("tests import from scripts/ (run the script as a subprocess, or "
                           f"move what the test needs into a package): {offenders}")


def test_the_check_sees_each_way_of_importing_a_script() -> None:
    caught = [
        "from scripts.gen_docs import main",
        "    import scripts.chaos",
        "from bench_floor import measure_floor  # a script, not a package",
        'sys.path.insert(0, str(ROOT / "scripts"))',
        'monkeypatch.syspath_prepend(str(ROOT / "scripts"))',
        'runpy.run_path(str(ROOT / "scripts" / "chaos.py"))',
    ]
    for line in caught:
        assert script_imports(line), line
    passed = [
        "from ps.chaos.cli import chaos",
        "import chaos_data",  # not a script's name
        'subprocess.run([sys.executable, str(ROOT / "scripts" / "chaos.py")])',
        'RELAY = ROOT / "scripts" / "delay_relay.py"',
    ]
    for line in passed:
        assert not script_imports(line), line


def test_only_the_chaos_package_and_the_scripts_import_it() -> None:
    importers = []
    for package in ("common", "server", "worker", "ps", "tests"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.is_relative_to(ROOT / "ps" / "chaos"):
                continue
            if CHAOS.search(path.read_text(encoding="utf-8")):
                importers.append(path.relative_to(ROOT).as_posix())
    assert importers == [], f"only ps/chaos/ and scripts/ may import ps.chaos: {importers}"
