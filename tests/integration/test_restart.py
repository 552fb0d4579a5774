"""A server killed mid-run and restarted with --resume: the run completes, and ends
with the same parameters as the reference engine (nothing lost, nothing doubled)."""

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
from ps.reference.engine import simulate
from server.checkpoint import final_parameters, read_run_checkpoint
from tests.integration.conftest import checkpoint_round, wait_for

pytestmark = pytest.mark.integration

# a step schedule too: the killed server resumes past its first milestone, on the rate
# of its round
CFG = RunConfig(dataset="synthetic", num_workers=3, num_shards=2, rule="marmed",
                rounds=40, seed=5, lr_milestones=(8, 20), lr_decay=0.5).validate()
TEAM = f"0-{CFG.num_workers - 1}"  # --worker-id: every worker in one process


def _server(processes, tmp_path: Path, shard: int, bind: str, *extra: str):
    keys = ["--keys", str(tmp_path / "keys")]
    ready = tmp_path / f"server-{shard}.endpoint"
    ready.unlink(missing_ok=True)
    proc = processes.start(f"server-{shard}", "server.cli", [
        "--shard", str(shard), "--bind", bind, "--ready-file", str(ready),
        "--out-dir", str(tmp_path), "--linger", "0", "--round-timeout", "none", *keys, *extra,
        *to_argv(CFG, SERVER)])
    return proc, processes.endpoint(ready, proc)


def test_killed_server_resumes_and_the_run_ends_bit_identical(processes, tmp_path,
                                                                run_keys) -> None:
    keys = run_keys(CFG.num_shards, CFG.num_workers)
    _, e0 = _server(processes, tmp_path, 0, "tcp://127.0.0.1:*")
    # checkpoints every 5 rounds: the restarted server is behind, the workers replay
    victim, e1 = _server(processes, tmp_path, 1, "tcp://127.0.0.1:*", "--checkpoint-every", "5")
    workers = [processes.start("workers", "worker.cli", [  # one process, every worker
        "--servers", f"{e0},{e1}", "--worker-id", TEAM, "--timeout", "1.5",
        "--retries", "20", *keys, *to_argv(CFG, SERVER)])]

    def rounds_done() -> int:
        return len(read_jsonl(tmp_path / "server-1.jsonl"))

    ring = KeyRing(tmp_path / "keys")
    wait_for(lambda: rounds_done() >= 12 and checkpoint_round(tmp_path, CFG, 1, ring) >= 10,
             120, "server 1 to reach round 12 and checkpoint round 10")
    victim.signal(signal.SIGKILL)
    processes.wait_exit(victim, 10)
    reached = rounds_done()
    killed_at = read_run_checkpoint(tmp_path, CFG, 1, ring, finite=True).round
    assert 10 <= killed_at < CFG.rounds

    restarted, _ = _server(processes, tmp_path, 1, e1, "--resume", "--checkpoint-every", "5")
    for w in workers:
        assert processes.wait_exit(w, 180) == 0, w.tail()
    assert processes.wait_exit(restarted, 60) == 0
    assert any("resumed shards 1 from" in line for line in restarted.tail(40))
    # a round past the checkpoint's completed: every worker had pulled beyond it and
    # replayed. (One round past is not enough: the server may have written that round's
    # line and died before its PARAMS reached the workers, which then simply push again.)
    if reached > killed_at + 1:
        assert all(any("replaying" in line for line in w.tail(400)) for w in workers)

    params = final_parameters(tmp_path, CFG, ring)  # every shard at the last round
    torch.set_num_threads(1)
    reference = simulate(CFG, AttackConfig().validate(CFG))
    np.testing.assert_array_equal(params, reference.params)


def test_killed_proxy_restarts_and_the_run_ends_bit_identical(processes, tmp_path,
                                                              run_keys) -> None:
    keys = run_keys(CFG.num_shards, CFG.num_workers, (0,))
    attack = AttackConfig.build(proxy_attack="gambler", proxy_shards=(0,), gambler_p=0.001)
    _, e0 = _server(processes, tmp_path, 0, "tcp://127.0.0.1:*")
    _, e1 = _server(processes, tmp_path, 1, "tcp://127.0.0.1:*")

    def proxy(bind: str):
        ready = tmp_path / "proxy.endpoint"
        ready.unlink(missing_ok=True)
        proc = processes.start("proxy-0", "ps.proxy.cli", [
            "--bind", bind, "--server", e0, "--proxy-attack", "gambler",
            "--gambler-p", repr(attack.attack('gambler').p), "--out-dir", str(tmp_path),
            "--ready-file", str(ready), "--shard", "0", *keys, *to_argv(CFG, SERVER)])
        return proc, processes.endpoint(ready, proc)

    victim, front = proxy("tcp://127.0.0.1:*")
    workers = [processes.start("workers", "worker.cli", [  # one process, every worker
        "--servers", f"{front},{e1}", "--via-proxy", "0", "--worker-id", TEAM,
        "--timeout", "1.5", "--retries", "20", *keys, *to_argv(CFG, SERVER)])]
    wait_for(lambda: len(read_jsonl(tmp_path / "proxy-0.jsonl")) >= 12, 120,
             "the proxy to relay 12 rounds")
    victim.signal(signal.SIGKILL)
    processes.wait_exit(victim, 10)
    restarted, _ = proxy(front)
    for w in workers:
        assert processes.wait_exit(w, 180) == 0, w.tail()
    assert processes.wait_exit(restarted, 60) == 0

    params = final_parameters(tmp_path, CFG, KeyRing(tmp_path / "keys"))
    torch.set_num_threads(1)
    reference = simulate(CFG, attack.validate(CFG))
    assert reference.corrupted_values > 0
    np.testing.assert_array_equal(params, reference.params)
