"""``ps-list``: everything a run can name, from the registries every command reads, with
its summary, preconditions and options (text, or ``--json`` for scripts)."""

from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner

from common.learn.attacks import ATTACKS
from common.learn.data import DATASETS
from common.learn.models import MODELS
from common.learn.rules import RULES, Rule, register_rule
from common.learn.rules.pre import PRE_AGGREGATORS
from ps.list_cli import main


def _listed(*args: str) -> list[dict]:
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_every_registered_thing_is_listed_with_where_it_is_named() -> None:
    entries = _listed()
    by_kind: dict[str, list[str]] = {}
    for e in entries:
        by_kind.setdefault(e["kind"], []).append(e["name"])
    assert sorted(by_kind["rules"]) == sorted(RULES)
    assert by_kind["pre"] == list(PRE_AGGREGATORS)
    assert by_kind["attacks"] == list(ATTACKS)
    assert by_kind["models"] == list(MODELS)
    assert by_kind["datasets"] == list(DATASETS)
    krum = next(e for e in entries if e["name"] == "krum")
    assert (krum["flag"], krum["needs"]) == ("--rule", "2q+2 < n")
    gambler = next(e for e in entries if e["name"] == "gambler")
    assert gambler["flag"] == "--proxy-attack" and gambler["details"]["where"] == ["proxy"]
    assert {o["flag"]: o["default"] for o in gambler["options"]} == {
        "--gambler-p": 0.0005, "--gambler-scale": -1e20}
    assert all(o["env"].startswith("PS_") and o["help"] for e in entries
               for o in e["options"])


def test_the_text_names_each_kind_its_flag_and_each_option_its_default() -> None:
    result = CliRunner().invoke(main, ["rules", "pre"])
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0] == "rules (--rule)" and "pre (--pre, a chain such as arc,nnm)" in lines
    assert any(line.split()[:1] == ["krum"] and "[needs 2q+2 < n]" in line for line in lines)
    assert "      --cc-tau (PS_CC_TAU, default 100.0): Centered clipping" in result.output
    assert "attacks" not in result.output
    assert CliRunner().invoke(main, ["rulez"]).exit_code == 2


def test_a_newly_registered_rule_is_listed() -> None:
    @register_rule
    class Doubled(Rule):
        name = "test-doubled-mean"
        summary = "twice the mean (a test's)"
        needs = "q = 0"

        def aggregate(self, G):
            return 2 * G.mean(0)

    try:
        entry = next(e for e in _listed("rules") if e["name"] == "test-doubled-mean")
        assert (entry["summary"], entry["needs"]) == ("twice the mean (a test's)", "q = 0")
    finally:
        del RULES["test-doubled-mean"]


def test_listing_imports_neither_torch_nor_numba() -> None:
    code = ("import sys; from ps.catalog import catalog; catalog(); "
            "print(sorted(m for m in ('torch', 'numba') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
