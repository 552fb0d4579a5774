"""Pre-aggregation and the new rules through real processes: ``--pre nnm`` in front of
trimmed mean survives a Byzantine worker that wrecks the mean, bucketing and centered
clipping end bit-identical to the reference engine (each server shuffles and clips its
own shard's rows), and a killed centered-clipping server resumes with its state."""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from common.conf.settings import SERVER, to_argv
from common.net.keys import KeyRing
from common.run.config import AttackConfig, RunConfig
from common.run.metrics import read_jsonl
from ps.launcher.cluster import Cluster, ClusterSpec
from ps.launcher.options import ClusterOptions
from ps.reference.engine import simulate
from server.checkpoint import final_parameters, read_run_checkpoint
from tests.integration.conftest import checkpoint_round, wait_for
from worker.options import ClientOptions, EvalOptions

pytestmark = pytest.mark.integration

# one omniscient worker of 5 sends -1e20 x the sum of the honest gradients
ATTACK = AttackConfig.build(worker_attack="omniscient", byzantine_workers=(2,))


def _run(tmp_path: Path, attack: AttackConfig, rounds: int, eval_every: int, **changes):
    settings = {"dataset": "synthetic", "num_workers": 5, "num_shards": 2, "q": 1,
                "rounds": rounds, "lr": 0.1, "batch_size": 32, "seed": 3} | changes
    cfg = RunConfig(**settings).validate()
    attack = attack.validate(cfg)
    spec = ClusterSpec(cfg=cfg, attack=attack, out_dir=tmp_path / "run",
                       evaluation=EvalOptions(eval_every=eval_every),
                       client=ClientOptions(timeout_s=30, retries=2),
                       cluster=ClusterOptions(run_timeout_s=120))
    return cfg, attack, Cluster(spec).run()


def test_nnm_then_trimmed_mean_survives_where_the_mean_fails(tmp_path: Path) -> None:
    cfg, attack, result = _run(tmp_path, ATTACK, rounds=40, eval_every=40,
                               rule="trimmed-mean", pre="nnm")
    assert np.isfinite(result.params).all()
    assert result.evaluations[-1]["round"] == 40 and result.evaluations[-1]["top1"] > 0.6
    for s in range(2):
        lines = read_jsonl(tmp_path / "run" / f"server-{s}.jsonl")
        assert [r["round"] for r in lines] == list(range(40))
        assert all(r["rule_info"] == {} for r in lines)  # nothing non-finite to pass on

    torch.set_num_threads(1)  # the processes use one thread; so must the reference
    reference = simulate(cfg, attack)
    assert reference.digest == result.digest
    np.testing.assert_array_equal(reference.params, result.params)

    # the same run, mean without pre-aggregation: the 1e20-scaled vector takes over
    plain = simulate(RunConfig(**{**cfg.to_dict(), "rule": "mean", "pre": None}), attack)
    assert not np.isfinite(plain.params).all() or np.abs(plain.params).max() > 1e6


def test_bucketing_and_centered_clipping_end_bit_identical(tmp_path: Path) -> None:
    """Bucketing's shuffle (seeded per round and shard) and centered clipping's state
    (kept by each server) give the reference engine's parameters bit for bit."""
    cfg, attack, result = _run(tmp_path, ATTACK, rounds=12, eval_every=12,
                               rule="centered-clipping", cc_tau=1.0, pre="bucketing",
                               num_workers=6)
    assert np.isfinite(result.params).all()
    perms = [read_jsonl(tmp_path / "run" / f"server-{s}.jsonl")[0]["rule_info"]["pre"][0]
             for s in range(2)]
    assert perms[0]["permutation"] != perms[1]["permutation"]  # a shuffle per shard
    torch.set_num_threads(1)
    reference = simulate(cfg, attack)
    np.testing.assert_array_equal(reference.params, result.params)


CC_CFG = RunConfig(dataset="synthetic", num_workers=4, num_shards=2, rule="centered-clipping",
                   cc_tau=0.5, pre="arc", q=1, rounds=30, seed=5).validate()


def test_a_killed_centered_clipping_server_resumes_with_its_state(processes, tmp_path,
                                                                   run_keys) -> None:
    """SIGKILL a server mid-run; restarted with --resume it reloads the previous aggregate
    from its checkpoint (the workers replay what it lacks) and the run ends bit-identical
    to the reference engine."""
    keys = run_keys(CC_CFG.num_shards, CC_CFG.num_workers)

    def server(shard: int, bind: str, *extra: str):
        ready = tmp_path / f"server-{shard}.endpoint"
        ready.unlink(missing_ok=True)
        proc = processes.start(f"server-{shard}", "server.cli", [
            "--shard", str(shard), "--bind", bind, "--ready-file", str(ready),
            "--out-dir", str(tmp_path), "--linger", "0", "--checkpoint-every", "4", *keys,
            *extra, *to_argv(CC_CFG, SERVER)])
        return proc, processes.endpoint(ready, proc)

    _, e0 = server(0, "tcp://127.0.0.1:*")
    victim, e1 = server(1, "tcp://127.0.0.1:*")
    workers = [processes.start("workers", "worker.cli", [  # one process, every worker
        "--servers", f"{e0},{e1}", "--worker-id", f"0-{CC_CFG.num_workers - 1}", "--timeout",
        "1.5", "--retries", "20", *keys, *to_argv(CC_CFG, SERVER)])]
    ring = KeyRing(tmp_path / "keys")
    wait_for(lambda: len(read_jsonl(tmp_path / "server-1.jsonl")) >= 10
             and checkpoint_round(tmp_path, CC_CFG, 1, ring) >= 8, 60,
             "round 10 and the checkpoint of round 8")
    victim.signal(signal.SIGKILL)
    processes.wait_exit(victim, 10)
    ckpt = read_run_checkpoint(tmp_path, CC_CFG, 1, ring, finite=True)
    assert 8 <= ckpt.round < CC_CFG.rounds and set(ckpt.rule_state) == {"center"}

    restarted, _ = server(1, e1, "--resume")
    for w in workers:
        assert processes.wait_exit(w, 120) == 0, w.tail()
    assert processes.wait_exit(restarted, 60) == 0
    assert any("resumed shards 1 from" in line for line in restarted.tail(40))
    params = final_parameters(tmp_path, CC_CFG, ring)
    torch.set_num_threads(1)
    reference = simulate(CC_CFG, AttackConfig().validate(CC_CFG))
    np.testing.assert_array_equal(params, reference.params)
