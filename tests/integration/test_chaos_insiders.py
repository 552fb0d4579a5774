"""scripts/chaos.py through real processes with tiny quotas: the hostile classes, keyed to
Byzantine workers that never run, crash nothing; the bars hit only the attackers' keys;
a key that sends 2 GB messages is barred at its first and never connects again; and the
run, with a quorum, ends bit-identical to the reference engine replaying who took
part."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.scenario]

ROOT = Path(__file__).resolve().parents[2]
WORKERS, HONEST = 10, 6  # the attackers hold the keys of workers 6..9


def test_chaos_with_tiny_quotas(tmp_path: Path) -> None:
    report = tmp_path / "chaos.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "chaos.py"), "--frames", "200",
         "--workers", str(WORKERS), "--honest", str(HONEST), "--rounds", "200",
         "--giant-seconds", "3", "--bare-connections", "2000", "--idle-connections", "10",
         "--strangers", "4",
         "--cpu-messages", "0", "--json", str(report)],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert report.exists(), done.stderr[-4000:]
    summary = json.loads(report.read_text())["summary"]
    assert summary["crashes"] == 0, summary["crashed"]
    assert summary["run_finished"] and summary["bit_identical"], done.stderr[-4000:]
    assert done.returncode == 0
    attackers = {f"worker-{i}" for i in range(HONEST, WORKERS)}
    assert summary["barred"]["server-1"] and set(summary["barred"]["server-1"]) <= attackers
    assert summary["barred"]["proxy-0"] and set(summary["barred"]["proxy-0"]) <= attackers
    giant = summary["giant"]["giant"]
    assert giant["barred"] and giant["cuts"] == 1, giant
    assert giant["connections_after_first_offence"] == 0, giant
    assert giant["key"] in (summary["giant_first_barred_line"] or {}).get("barred", [])
    assert summary["peak_rss_growth_mb"]["giant_alone"]["server-1"] < 150
    assert summary["strangers"]["replies"] == 0
    # issue 35's key holders, each alone: what the node paid stays bounded
    keyholders = summary["keyholders"]
    assert keyholders["unread"]["pulls"] > 0 and keyholders["unread"]["rss_growth_mb"] < 100
    bare = keyholders["bare"]
    assert bare["counters"].get("cut", 0) > 0 and bare["rss_growth_mb"] < 100, bare
    envelopes = keyholders["proxy-envelopes"]
    assert envelopes["sessions_opened"] == 0 and envelopes["sent"] > 1000, envelopes
    # one key's refusal budget, whatever envelopes it made up: 200 at once, 100/s
    assert envelopes["replies"] <= 200 + 100 * (envelopes["seconds"] + 1), envelopes
    # every class was sent, and what was not answered was dropped, not lost
    assert not summary["classes_short_of_quota"]
    assert summary["answered"] > 0 and summary["unanswered_by_nodes"] > 0
