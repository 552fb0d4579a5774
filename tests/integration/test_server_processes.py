"""Server processes hosting several shards, through real processes: fewer processes than
shards (with keys), a proxy in front of a process corrupting one of its shards, a vector
attack that holds whole rounds, and a process of several shards killed and resumed from
its checkpoints. Every run ends bit-identical to the reference engine, which knows
nothing of processes (shards are logical)."""

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
from server.checkpoint import checkpoint_path, final_parameters, previous_path
from tests.integration.conftest import checkpoint_round, wait_for
from worker.options import ClientOptions, EvalOptions

pytestmark = pytest.mark.integration


def _cluster(tmp_path: Path, attack: AttackConfig, processes: int, workers: int | None = None,
             **cfg_changes):
    """A keyed cluster of ``processes`` server processes (and ``workers`` worker
    processes; None: the launcher's default); (cfg, attack, result)."""
    settings = {"dataset": "synthetic", "num_workers": 5, "rule": "meamed", "q": 1,
                "rounds": 12, "seed": 7} | cfg_changes
    cfg = RunConfig(**settings).validate()
    attack = attack.validate(cfg)
    spec = ClusterSpec(cfg=cfg, attack=attack, out_dir=tmp_path / "run",
                       evaluation=EvalOptions(eval_every=6),
                       client=ClientOptions(timeout_s=30, retries=2),
                       cluster=ClusterOptions(run_timeout_s=240, server_processes=processes,
                                              worker_processes=workers))
    return cfg, attack, Cluster(spec).run()


def _assert_as_the_reference(cfg: RunConfig, attack: AttackConfig, result) -> None:
    torch.set_num_threads(1)  # the processes use one thread; so must the reference
    reference = simulate(cfg, attack)
    assert reference.digest == result.digest
    np.testing.assert_array_equal(reference.params, result.params)


def _started(out: Path, role: str) -> list[str]:
    return sorted(p.stem for p in (out / "logs").glob(f"{role}-*.log"))


def test_four_shards_on_two_processes_end_bit_identical(tmp_path: Path) -> None:
    attack = AttackConfig.build(worker_attack="alie", byzantine_workers=(0,))
    cfg, attack, result = _cluster(tmp_path, attack, 2, num_shards=4)
    out = tmp_path / "run"
    assert _started(out, "server") == ["server-0", "server-2"]
    assert (out / "keys" / "server-2.key_secret").exists()
    for s in range(4):  # each shard its own metrics line and checkpoint
        lines = read_jsonl(out / f"server-{s}.jsonl")
        assert [(x["shard"], x["round"]) for x in lines] == [(s, t) for t in range(12)]
        assert checkpoint_path(out, s).exists() and previous_path(out, s).exists()
    _assert_as_the_reference(cfg, attack, result)


def test_a_proxy_corrupts_one_shard_of_its_process_and_passes_the_others(
        tmp_path: Path) -> None:
    attack = AttackConfig.build(proxy_attack="gambler", proxy_shards=(1,), gambler_p=0.01,
                                corrupt_params=True, worker_attack="alie",
                                byzantine_workers=(4,))
    # two worker processes: the workers that borrow x from another's reply get their own
    # corrupted PARAMS all the same (the proxy asks the values for each)
    cfg, attack, result = _cluster(tmp_path, attack, 2, workers=2, num_shards=5)
    out = tmp_path / "run"
    assert _started(out, "server") == ["server-0", "server-3"]
    assert _started(out, "proxy") == ["proxy-0"]  # in front of shards 0-2
    assert _started(out, "worker") == ["worker-0", "worker-3"]
    tallies = read_jsonl(out / "proxy-0.jsonl")
    pushed = [x for x in tallies if "corrupted_values" in x]
    assert len(pushed) == 12 and all(x["corrupted_values"] > 0 for x in pushed)
    # shard 1 alone is corrupted: at p=0.01 its ~24k values give ~240 a round per
    # worker, shards 0-2 together would give three times as many
    assert all(x["corrupted_values"] < 2 * 0.01 * 5 * 24_000 for x in pushed)
    _assert_as_the_reference(cfg, attack, result)  # the engine corrupts shard 1 only


def test_a_vector_attack_holding_rounds_on_two_processes(tmp_path: Path) -> None:
    attack = AttackConfig.build(proxy_attack="omniscient", proxy_victims=(2,),
                                proxy_shards=(0, 4))
    cfg, attack, result = _cluster(tmp_path, attack, 3, num_shards=5, rule="krum",
                                   num_workers=6)
    out = tmp_path / "run"
    assert _started(out, "server") == ["server-0", "server-2", "server-4"]
    assert _started(out, "proxy") == ["proxy-0", "proxy-4"]
    _assert_as_the_reference(cfg, attack, result)


CFG = RunConfig(dataset="synthetic", num_workers=3, num_shards=3, rule="marmed",
                rounds=40, seed=5).validate()
TEAM = f"0-{CFG.num_workers - 1}"  # --worker-id: every worker in one process


def _server(processes, tmp_path: Path, shards: str, bind: str, *extra: str):
    ready = tmp_path / f"server-{shards}.endpoint"
    ready.unlink(missing_ok=True)
    proc = processes.start(f"server-{shards}", "server.cli", [
        "--shard", shards, "--bind", bind, "--ready-file", str(ready),
        "--out-dir", str(tmp_path), "--linger", "0", "--keys", str(tmp_path / "keys"),
        *extra, *to_argv(CFG, SERVER)])
    return proc, processes.endpoint(ready, proc)


def test_a_killed_process_of_two_shards_resumes_and_the_run_ends_bit_identical(
        processes, tmp_path, run_keys) -> None:
    keys = run_keys(CFG.num_shards, CFG.num_workers)
    # shards 0-1 in one process, checkpointed every 5 rounds; shard 2 in another
    victim, e01 = _server(processes, tmp_path, "0-1", "tcp://127.0.0.1:*",
                          "--checkpoint-every", "5")
    _, e2 = _server(processes, tmp_path, "2", "tcp://127.0.0.1:*")
    workers = [processes.start("workers", "worker.cli", [  # one process, every worker
        "--servers", f"{e01},{e2}", "--worker-id", TEAM, "--timeout", "1.5",
        "--retries", "20", *keys, *to_argv(CFG, SERVER)])]
    ring = KeyRing(tmp_path / "keys")
    wait_for(lambda: len(read_jsonl(tmp_path / "server-1.jsonl")) >= 12 and all(
        checkpoint_round(tmp_path, CFG, s, ring, process=0) >= 10 for s in (0, 1)), 120,
        "shards 0-1 to reach round 12 and checkpoint round 10")
    victim.signal(signal.SIGKILL)
    processes.wait_exit(victim, 10)
    restarted, _ = _server(processes, tmp_path, "0-1", e01, "--resume",
                           "--checkpoint-every", "5")
    for w in workers:
        assert processes.wait_exit(w, 180) == 0, w.tail()
    assert processes.wait_exit(restarted, 60) == 0
    resumed = [line for line in restarted.tail(60) if "resumed shards 0-1" in line]
    assert resumed and "at round 1" in resumed[0]  # round 10 or 15: a checkpoint's
    params = final_parameters(tmp_path, CFG, ring, processes=2)  # each with its key
    torch.set_num_threads(1)
    reference = simulate(CFG, AttackConfig().validate(CFG))
    np.testing.assert_array_equal(params, reference.params)


def test_an_evaluator_that_starts_after_every_worker_pushed_still_reads_round_0(
        processes, tmp_path, run_keys) -> None:
    """With ``--await-evaluator`` (what ps-cluster and the deployments set) round 0 stays
    open until the evaluator has said HELLO: an evaluator that a loaded host starts
    after the workers still measures the run's starting point and every round after."""
    keys = run_keys(CFG.num_shards, CFG.num_workers)
    servers = [_server(processes, tmp_path, shards, "tcp://127.0.0.1:*",
                       "--await-evaluator", "--linger", "120")
               for shards in ("0-1", "2")]
    endpoints = ",".join(endpoint for _, endpoint in servers)
    workers = [processes.start("workers", "worker.cli", [  # one process, every worker
        "--servers", endpoints, "--worker-id", TEAM, "--timeout", "30", *keys,
        *to_argv(CFG, SERVER)])]
    for proc, _ in servers:  # the workers' pushes of round 0 have come (its log says so)
        wait_for(lambda proc=proc: any("waits for the evaluator" in line
                                       for line in proc.tail(40)), 120, "round 0 to wait")
    assert all(not read_jsonl(p) for p in tmp_path.glob("server-*.jsonl"))  # none closed
    evaluator = processes.start("evaluator", "worker.cli", [
        "--servers", endpoints, "--evaluate", "--eval-every", "10", "--out-dir",
        str(tmp_path), "--timeout", "30", *keys, *to_argv(CFG, SERVER)])
    assert processes.wait_exit(evaluator, 120) == 0, evaluator.tail()
    for proc in [*workers, *(p for p, _ in servers)]:
        assert processes.wait_exit(proc, 60) == 0, proc.tail()
    rounds = [x["round"] for x in read_jsonl(tmp_path / "evaluator.jsonl")]
    assert rounds[0] == 0 and rounds[-1] == CFG.rounds  # (a slow one may skip between)
