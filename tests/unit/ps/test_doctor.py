"""``ps-doctor`` (``ps/doctor/``) and the CURVE check ``ps-cluster`` makes at start: the
real measurements run (briefly), and the warning path is driven by a fake slow CURVE."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from common.net.keys import SecurityOptions
from ps.doctor import checks
from ps.doctor.cli import main
from ps.launcher.cli import slow_curve


def test_the_wire_is_measured_with_and_without_curve_and_leaves_no_thread() -> None:
    """... and nothing of ZeroMQ running afterwards: ps-cluster measures before it forks."""
    import threading

    before = threading.active_count()
    plain = checks.wire_throughput(False, 2, 1 << 20)
    curve = checks.wire_throughput(True, 2, 1 << 20)
    assert plain > 0 and curve > 0
    assert threading.active_count() == before


def test_a_fast_curve_is_quiet_and_a_slow_one_names_the_fix() -> None:
    assert checks.curve_warning(checks.CURVE_WARN_GBPS) == ""
    warning = checks.curve_warning(0.09)
    assert "0.09 GB/s, under 0.3 GB/s" in warning and "pyzmq 27.3.0 or newer" in warning


@pytest.fixture
def slow_curve_here(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """CURVE measured at 0.1 GB/s, plain ZMTP at 2; the calls' ``curve`` flags."""
    calls: list[bool] = []

    def fake(curve: bool, messages: int, message_bytes: int = 0) -> float:
        calls.append(curve)
        return 0.1 if curve else 2.0

    monkeypatch.setattr(checks, "wire_throughput", fake)
    return calls


def test_ps_doctor_warns_of_a_slow_curve_and_strict_fails(slow_curve_here) -> None:
    runner = CliRunner()
    done = runner.invoke(main, ["--skip", "kernels", "--skip", "cuda", "--device", "cpu"])
    assert done.exit_code == 0, done.output
    assert "CURVE 0.10 GB/s (0.05 of plain)" in done.output
    assert "WARNING: CURVE runs at 0.10 GB/s, under 0.3 GB/s" in done.output
    strict = runner.invoke(main, ["--skip", "kernels", "--skip", "cuda", "--strict"])
    assert strict.exit_code == 1
    found = json.loads(runner.invoke(main, ["--skip", "kernels", "--json"]).output)
    wire = next(f for f in found if f["check"] == "wire")
    assert wire["values"] == {"plain_gbps": 2.0, "curve_gbps": 0.1} and wire["warning"]


def test_ps_cluster_with_keys_warns_at_start_of_a_slow_curve(slow_curve_here) -> None:
    assert "CURVE runs at 0.10 GB/s" in slow_curve(SecurityOptions())
    assert slow_curve(SecurityOptions(insecure=True)) == ""
    assert slow_curve_here == [True]  # measured once, with keys only


def test_ps_doctor_reports_every_check_on_this_machine() -> None:
    done = CliRunner().invoke(main, ["--messages", "2", "--device", "cpu", "-n", "6",
                                     "--worker-processes", "3"])
    assert done.exit_code == 0, done.output
    for check in ("versions", "wire", "kernels", "threads", "cuda", "placement"):
        assert any(line.startswith(check) for line in done.output.splitlines()), check
    assert ("worker-0 (workers 0-1): cpu; worker-2 (workers 2-3): cpu; worker-4 (workers "
            "4-5): cpu") in done.output


def test_placement_spreads_worker_processes_over_the_gpus(monkeypatch) -> None:
    import worker.device

    monkeypatch.setattr(worker.device, "cuda_devices", lambda: 2)
    found = checks.placement("cuda", 20, 4)[0]
    assert found.values == {"worker-0": "cuda:0", "worker-5": "cuda:1",
                            "worker-10": "cuda:0", "worker-15": "cuda:1"}
    # unequal blocks (3, 3, 2, 2): the k-th process, not its first worker, picks
    uneven = checks.placement("auto", 10, 4)[0]
    assert list(uneven.values.values()) == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    assert checks.placement("cuda:1", 10, 4)[0].values["worker-8"] == "cuda:1"
