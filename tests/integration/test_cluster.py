"""Whole clusters of real local processes, launched by ``ps.launcher.cluster`` on loopback."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import common.learn.data
from common.errors import ConfigError
from common.run.config import AttackConfig, RunConfig
from common.run.metrics import read_jsonl
from ps.launcher.cluster import Cluster, ClusterSpec
from ps.launcher.options import ClusterOptions
from ps.launcher.supervise import ProcessFailed
from ps.reference.engine import simulate
from worker.options import ClientOptions, EvalOptions

pytestmark = pytest.mark.integration

CHANCE = 0.1  # 10 balanced classes


def _run(tmp_path: Path, attack: AttackConfig | None = None, start: str = "fork",
         **cfg_changes):
    settings = {"dataset": "synthetic", "num_workers": 5, "num_shards": 2, "rule": "marmed",
                "rounds": 40, "lr": 0.1, "batch_size": 32, "seed": 3} | cfg_changes
    cfg = RunConfig(**settings).validate()
    attack = (attack or AttackConfig()).validate(cfg)
    spec = ClusterSpec(cfg=cfg, attack=attack, out_dir=tmp_path / "run",
                       evaluation=EvalOptions(eval_every=20),
                       client=ClientOptions(timeout_s=30, retries=2),
                       cluster=ClusterOptions(run_timeout_s=240, start=start))
    return cfg, attack, Cluster(spec).run()


def test_training_across_two_shards_rises_well_above_chance(tmp_path: Path) -> None:
    _, _, result = _run(tmp_path)
    evals = result.evaluations
    assert [e["round"] for e in evals] == [0, 20, 40]
    assert evals[-1]["top1"] > 0.6 > evals[0]["top1"]
    assert evals[-1]["top3"] >= evals[-1]["top1"]
    for s in range(2):
        rounds = read_jsonl(tmp_path / "run" / f"server-{s}.jsonl")
        assert [r["round"] for r in rounds] == list(range(40))
        assert all(r["errors"] == 0 and r["nonfinite_values"] == 0 for r in rounds)
    for i in range(5):
        assert len(read_jsonl(tmp_path / "run" / f"worker-{i}.jsonl")) == 40
    assert (tmp_path / "run" / "summary.json").exists()


# With n=7 a coordinate needs 4 corrupted values to move MarMed out of the honest range:
# at p=0.002 that is ~3e-5 coordinates per round, while ~800 values are corrupted.
GAMBLER = AttackConfig.build(proxy_attack="gambler", proxy_shards=(0,), gambler_p=0.002)


def test_gambler_proxy_marmed_survives(tmp_path: Path) -> None:
    _, _, result = _run(tmp_path, GAMBLER, rule="marmed", num_workers=7)
    proxy = read_jsonl(tmp_path / "run" / "proxy-0.jsonl")
    assert len(proxy) == 40 and all(r["corrupted_values"] > 100 for r in proxy)
    assert np.isfinite(result.params).all()
    assert result.evaluations[-1]["top1"] > 0.6


def test_gambler_proxy_mean_fails(tmp_path: Path) -> None:
    _, _, result = _run(tmp_path, GAMBLER, rule="mean", num_workers=7)
    final = result.evaluations[-1]
    assert not np.isfinite(result.params).all() or final["top1"] < 2 * CHANCE
    assert math.isnan(final["loss"]) or final["top1"] < 2 * CHANCE


def test_byzantine_worker_with_marmed(tmp_path: Path) -> None:
    attack = AttackConfig.build(worker_attack="gaussian", byzantine_workers=(1,))
    _, _, result = _run(tmp_path, attack, rule="marmed")
    assert result.evaluations[-1]["top1"] > 0.6


def test_cluster_and_reference_engine_end_bit_identical(tmp_path: Path) -> None:
    """Attacks on the proxy (gambler, also on PARAMS) and a Byzantine worker (ALIE), S=3."""
    attack = AttackConfig.build(worker_attack="alie", byzantine_workers=(0,),
                                proxy_attack="gambler", proxy_shards=(1,), gambler_p=0.002,
                                corrupt_params=True)
    cfg, attack, result = _run(tmp_path, attack, rule="meamed", q=1, num_shards=3, rounds=15)
    torch.set_num_threads(1)  # the processes use one thread; so must the reference
    reference = simulate(cfg, attack)
    assert reference.corrupted_values > 0
    assert reference.digest == result.digest
    np.testing.assert_array_equal(reference.params, result.params)


def test_a_step_schedule_ends_bit_identical_and_every_shard_logs_its_rate(
        tmp_path: Path) -> None:
    """--lr-milestones 4,7: every shard's server steps its rate down at the same rounds
    (it says so in server-<s>.jsonl), and the reference engine, which applies the same
    schedule, ends with the same bits, not those of the constant rate."""
    cfg, attack, result = _run(tmp_path, AttackConfig.build(worker_attack="alie",
                                                             byzantine_workers=(0,)),
                               rule="meamed", q=1, rounds=10, lr_milestones=(7, 4),
                               lr_decay=0.5)
    assert cfg.lr_milestones == (4, 7)
    for s in range(2):
        rates = [r["lr"] for r in read_jsonl(tmp_path / "run" / f"server-{s}.jsonl")]
        assert rates == [0.1] * 4 + [0.05] * 3 + [0.025] * 3
    torch.set_num_threads(1)
    assert simulate(cfg, attack).digest == result.digest
    assert simulate(replace(cfg, lr_milestones=(), lr_decay=0.1), attack).digest != result.digest


@pytest.mark.parametrize(("attack", "momentum"), [
    (AttackConfig.build(worker_attack="alie", byzantine_workers=(0,), proxy_attack="gambler",
                        proxy_shards=(1,), gambler_p=0.002), 0.0),
    (AttackConfig.build(proxy_attack="omniscient", proxy_shards=(0,), proxy_victims=(1, 2)),
     0.0),
    (AttackConfig.build(worker_attack="alie", byzantine_workers=(0, 3)), 0.9),
], ids=["alie-worker-gambler-proxy", "omniscient-proxy", "alie-workers-momentum"])
def test_bfloat16_on_the_wire_ends_bit_identical_and_differs_from_float32(
        tmp_path: Path, attack: AttackConfig, momentum: float) -> None:
    """Workers round their vectors to bfloat16 (with momentum: the vector they push, their
    momentum kept in float32; the Byzantine ones track the honest momentum), a proxy
    corrupts the widened values (one at a time, or a whole round) and rounds what it
    forwards: the reference engine rounds at the same points and ends with the same
    bits, which are not float32's."""
    cfg, attack, result = _run(tmp_path, attack, rule="meamed", q=2, num_workers=7,
                               num_shards=3, rounds=10, wire_dtype="bfloat16",
                               worker_momentum=momentum)
    assert np.isfinite(result.params).all()
    torch.set_num_threads(1)
    reference = simulate(cfg, attack)
    assert (reference.corrupted_values > 0) == (attack.proxy_attack != "none")
    assert reference.digest == result.digest
    assert simulate(replace(cfg, wire_dtype="float32"), attack).digest != result.digest
    proxies = [r for f in (tmp_path / "run").glob("proxy-*.jsonl") for r in read_jsonl(f)]
    assert sum(r["corrupted_values"] for r in proxies) == reference.corrupted_values


def test_ps_cluster_draws_the_run_figures_when_it_finishes(processes, tmp_path: Path) -> None:
    out = tmp_path / "run"
    launcher = processes.start("cluster", "ps.launcher.cli", [
        "--dataset", "synthetic", "--rounds", "6", "--workers", "4", "--shards", "2",
        "--proxy-attack", "gambler", "--eval-every", "3", "--tensorboard-every", "2",
        "--insecure", "--out-dir", str(out)])
    assert processes.wait_exit(launcher, 120) == 0, launcher.tail(30)
    names = ("accuracy.png", "round_time.png", "corruption.png", "aggregation.png",
             "partition.png")
    assert f"figures in {out}: {', '.join(names)}" in launcher.tail(5)
    for name in names:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
    pytest.importorskip("tensorboard")  # the optional extra: the run's event files
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("test/top1")] == [0, 3, 6]
    assert [e.step for e in events.Scalars("proxy/corrupted_values/proxy-0")] == [0, 2, 4]
    assert {f"train/loss/worker-{i}" for i in range(4)} <= set(events.Tags()["scalars"])


def test_a_failing_process_stops_the_cluster_and_is_named(tmp_path: Path,
                                                         monkeypatch) -> None:
    # mnist needs --data-dir: the launcher is handed a stand-in (it computes the workers'
    # partition before starting them), but its children, started as fresh interpreters,
    # have none; every worker fails with a configuration error (exit 2), and the first
    # one is named
    monkeypatch.setitem(common.learn.data._preloaded, ("mnist", None, 3, 0.0),
                        common.learn.data.load_dataset("synthetic", seed=3))
    with pytest.raises(ProcessFailed) as info:
        _run(tmp_path, dataset="mnist", start="exec")
    assert info.value.exit_code == 2
    assert "mnist" in str(info.value)


@pytest.mark.parametrize("start", ["fork", "exec"])
def test_the_launcher_refuses_a_missing_dataset_before_starting_anything(
        tmp_path: Path, start: str) -> None:
    # it reads the dataset itself (to partition it; forking, to share it) before starting
    # any process: the same error, from the launcher
    with pytest.raises(ConfigError, match="mnist"):
        _run(tmp_path, dataset="mnist", start=start)
    assert not list((tmp_path / "run" / "logs").glob("*.log"))


def test_the_launcher_refuses_a_worker_left_without_a_batch_before_starting_anything(
        tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--partition dirichlet --alpha 0\.1 leaves worker "
                       r"4 with 27 training samples, fewer than one batch \(--batch-size 32\)"):
        _run(tmp_path, start="exec", num_workers=8, seed=0, partition="dirichlet", alpha=0.1)
    assert not list((tmp_path / "run" / "logs").glob("*.log"))


def test_ps_cluster_dirichlet_partition_verifies_and_draws_the_partition(
        processes, tmp_path: Path) -> None:
    """--partition dirichlet --alpha 0.1, split over the honest workers (``--iid-workers``
    names the label-flipping one): the cluster ends bit-identical to the reference engine
    (--verify), and the run holds each worker's class counts and their figure."""
    out = tmp_path / "run"
    launcher = processes.start("cluster", "ps.launcher.cli", [
        "--dataset", "synthetic", "--rounds", "8", "--workers", "8", "--shards", "2",
        "--seed", "2", "--partition", "dirichlet", "--alpha", "0.1", "--eval-every", "4",
        "--iid-workers", "0", "--worker-attack", "labelflip", "--byzantine-workers", "0",
        "--insecure", "--verify", "--out-dir", str(out)])
    assert processes.wait_exit(launcher, 180) == 0, launcher.tail(30)
    tail = launcher.tail(10)
    assert any(line.startswith("verified: the reference engine ends with the same "
                               "parameters") for line in tail), tail
    record = json.loads((out / "partition.json").read_text())
    assert (record["partition"], record["alpha"], record["seed"], record["iid_workers"]) \
        == ("dirichlet", 0.1, 2, [0])
    counts = np.array(record["counts"])
    assert counts.shape == (8, 10) and counts[1:].sum() == 2048  # the honest hold it all
    assert counts[0].sum() == 256 and counts[0].min() > 0  # an iid share: every class
    # skewed: most honest workers hold most of their data in one class
    assert np.median(counts[1:].max(axis=1) / counts[1:].sum(axis=1)) > 0.5
    assert f"figures in {out}: accuracy.png, round_time.png, aggregation.png, " \
        "partition.png" in tail
    assert (out / "partition.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_processes_started_as_fresh_interpreters_end_bit_identical(tmp_path: Path) -> None:
    """--start exec, as a deployment starts them one by one: the same final parameters."""
    attack = AttackConfig.build(worker_attack="omniscient", byzantine_workers=(0,),
                                proxy_attack="bitflip", proxy_shards=(1,))
    cfg, attack, result = _run(tmp_path, attack, start="exec", rule="meamed", q=1,
                               rounds=10)
    torch.set_num_threads(1)
    assert simulate(cfg, attack).digest == result.digest
