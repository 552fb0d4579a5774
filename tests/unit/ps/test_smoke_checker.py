"""The compose and swarm smoke tests' metrics checker (``scripts/check_smoke_metrics.py``)
on a fake run directory: what passes, and each problem it must name. The script is run
as the smoke tests run it, a command (``python3 scripts/check_smoke_metrics.py ...``)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "check_smoke_metrics.py"


def main(argv: list[str]) -> int:
    """Run the script on ``argv``; its output goes to this test's stdout and stderr (for
    ``capsys``); its exit status."""
    done = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True,
                          text=True, timeout=60, check=False)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return done.returncode

ENV = "# a comment\nPS_ROUNDS=3\nPS_SHARDS=2\nPS_WORKERS=2\nPS_RULE=marmed\nPS_Q=0\n"


def _write(runs: Path, service: str, lines: list[dict]) -> None:
    (runs / service).mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(line) + "\n" for line in lines)
    (runs / service / f"{service}.jsonl").write_text(text, encoding="utf-8")


def _run(tmp_path: Path, env: str = ENV) -> Path:
    """A finished run of 3 rounds, 2 shards, 2 workers (one directory per service)."""
    runs = tmp_path / "runs"
    _write(runs, "evaluator", [{"round": r, "top1": 0.3 * r, "top3": 0.5} for r in range(4)])
    for s in range(2):
        _write(runs, f"server-{s}", [{"round": r, "params_finite": True} for r in range(3)])
        (runs / f"server-{s}" / f"shard-{s}.npz").write_bytes(b"")
    for w in range(2):
        _write(runs, f"worker-{w}", [{"round": 0}])
    (tmp_path / "cluster.env").write_text(env, encoding="utf-8")
    return runs


def _check(tmp_path: Path, runs: Path, *extra: str) -> int:
    return main([str(runs), str(tmp_path / "cluster.env"), "0.5", *extra])


def test_a_finished_run_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _check(tmp_path, _run(tmp_path), "--workers", "2") == 0
    out = capsys.readouterr().out
    assert "top-1 by round: 0:0.000 1:0.300 2:0.600 3:0.900" in out
    assert "final top-1 0.9000" in out and "worker ids 0..1" in out


@pytest.mark.parametrize(("spoil", "extra", "problem"), [
    (lambda runs: _write(runs, "evaluator", [{"round": 3, "top1": 0.2}]), (),
     "final top-1 0.2 < 0.5"),
    (lambda runs: _write(runs, "evaluator", [{"round": 2, "top1": 0.9}]), (),
     "the evaluator's last round is 2, expected 3"),
    (lambda runs: _write(runs, "server-1", [{"round": 0}]), (),
     "server-1.jsonl has 1 rounds, expected 3"),
    (lambda runs: _write(runs, "server-0", [{"round": r, "params_finite": r < 2}
                                            for r in range(3)]), (),
     "server 0: parameters not finite"),
    (lambda runs: (runs / "server-1" / "shard-1.npz").unlink(), (),
     "server-1/shard-1.npz is missing"),
    (lambda runs: (runs / "worker-1" / "worker-1.jsonl").unlink(), ("--workers", "2"),
     "worker metrics for ids [0], expected 0..1"),
    (lambda runs: _write(runs, "proxy-0", [{"round": 0, "corrupted_values": 0}]), (),
     "proxy-0.jsonl: no value corrupted (gambler)"),
], ids=["top1", "last-round", "rounds", "finite", "checkpoint", "workers", "proxy"])
def test_each_problem_fails_the_check_and_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spoil: Callable[[Path], object],
    extra: tuple[str, ...], problem: str,
) -> None:
    runs = _run(tmp_path, ENV + "PS_PROXY_ATTACK=gambler\n")
    _write(runs, "proxy-0", [{"round": 0, "corrupted_values": 4}])
    assert _check(tmp_path, runs, *extra) == 0
    spoil(runs)
    assert _check(tmp_path, runs, *extra) == 1
    assert problem in capsys.readouterr().out


def test_a_proxy_attack_without_proxy_metrics_fails(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    runs = _run(tmp_path, ENV + "PS_PROXY_ATTACK=gambler\n")
    assert _check(tmp_path, runs) == 1
    assert "no proxy-*.jsonl: did the proxy run?" in capsys.readouterr().out


def test_a_missing_metrics_file_ends_the_check(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    runs = _run(tmp_path)
    (runs / "evaluator" / "evaluator.jsonl").unlink()
    assert _check(tmp_path, runs) == 1
    assert "evaluator.jsonl is missing" in capsys.readouterr().err


def test_later_env_files_override_earlier_ones(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The smoke tests pass the env file, then the experiment's overlay: the overlay's
    proxy attack counts (no proxy metrics: a failure), and its other settings too."""
    runs = _run(tmp_path, ENV + "PS_PROXY_ATTACK=none\n")
    assert _check(tmp_path, runs) == 0
    overlay = tmp_path / "gambler.env"
    overlay.write_text("# the experiment\nPS_PROXY_ATTACK=gambler\nPS_GAMBLER_P=0.0005\n")
    capsys.readouterr()
    assert main([str(runs), str(tmp_path / "cluster.env"), str(overlay), "0.5"]) == 1
    out = capsys.readouterr().out
    assert "proxy attack gambler (p=0.0005)" in out
    assert "no proxy-*.jsonl: did the proxy run?" in out
    _write(runs, "proxy-0", [{"round": 0, "corrupted_values": 7}])
    assert main([str(runs), str(tmp_path / "cluster.env"), str(overlay), "0.5"]) == 0
    assert "corrupted values: proxy-0 7" in capsys.readouterr().out
    overlay.write_text("PS_ROUNDS=4\n")  # the overlay's rounds: the run has 3
    assert main([str(runs), str(tmp_path / "cluster.env"), str(overlay), "0.5"]) == 1
    assert "the evaluator's last round is 3, expected 4" in capsys.readouterr().out

