"""The newer attacks and worker momentum through real processes (one family per test):
each run ends bit-identical to the reference engine, and the attacks do what they are
for: Min-Max wrecks Krum where NNM + trimmed mean keeps learning; label flipping and
worker momentum are computed by the worker processes as by the engine; the optimised
ALIE searches against the servers' own bucketing and rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from common.learn.data import load_dataset
from common.run.config import AttackConfig, RunConfig
from common.run.metrics import read_jsonl
from ps.launcher.cluster import Cluster, ClusterSpec
from ps.launcher.options import ClusterOptions
from ps.reference.engine import simulate
from worker.evaluator import Evaluator
from worker.options import ClientOptions, EvalOptions

pytestmark = pytest.mark.integration

BYZANTINE = (1, 4)  # 2 of n = 7


def _run(tmp_path: Path, attack: AttackConfig, rounds: int, **changes):
    settings = {"dataset": "synthetic", "num_workers": 7, "num_shards": 2, "q": 2,
                "rounds": rounds, "lr": 0.3, "batch_size": 32, "seed": 3,
                "worker_momentum": 0.9} | changes
    cfg = RunConfig(**settings).validate()
    attack = attack.validate(cfg)
    spec = ClusterSpec(cfg=cfg, attack=attack, out_dir=tmp_path / "run",
                       evaluation=EvalOptions(eval_every=rounds),
                       client=ClientOptions(timeout_s=30, retries=2),
                       cluster=ClusterOptions(run_timeout_s=120))
    result = Cluster(spec).run()
    torch.set_num_threads(1)  # the processes use one thread; so must the reference
    reference = simulate(cfg, attack)
    assert reference.digest == result.digest
    np.testing.assert_array_equal(reference.params, result.params)
    return cfg, attack, result


def _top1(cfg: RunConfig, params: np.ndarray) -> float:
    return Evaluator(cfg, load_dataset(cfg.dataset, None, seed=cfg.seed), None).evaluate(
        params).top1


def test_minmax_wrecks_krum_where_nnm_trimmed_mean_learns(tmp_path: Path) -> None:
    """Min-Max (inverse unit vector) with worker momentum 0.9: the malicious vector sits
    within the honest spread, so Krum selects it (Shejwalkar & Houmansadr's finding);
    NNM + trimmed mean keeps learning."""
    attack = AttackConfig.build(worker_attack="minmax", byzantine_workers=BYZANTINE,
                                minmax_perturbation="unit")
    cfg, attack, result = _run(tmp_path, attack, rounds=30, rule="trimmed-mean", pre="nnm")
    assert result.evaluations[-1]["round"] == 30 and result.evaluations[-1]["top1"] > 0.4
    krum = RunConfig(**{**cfg.to_dict(), "rule": "krum", "pre": None})
    assert _top1(krum, simulate(krum, attack).params) < 0.2
    clean = simulate(krum, AttackConfig().validate(krum))
    assert _top1(krum, clean.params) > 0.6


def test_labelflip_with_worker_momentum_is_the_engines(tmp_path: Path) -> None:
    """Two workers push the momentum of their own gradients of the labels 9 - y; every
    worker process keeps its momentum as the engine does."""
    attack = AttackConfig.build(worker_attack="labelflip", byzantine_workers=BYZANTINE)
    cfg, attack, result = _run(tmp_path, attack, rounds=12, rule="marmed", num_shards=3)
    assert all(len(read_jsonl(tmp_path / "run" / f"worker-{i}.jsonl")) == 12
               for i in range(7))
    # the momentum and the flipped labels both change what is pushed
    plain = RunConfig(**{**cfg.to_dict(), "worker_momentum": 0.0})
    assert simulate(plain, attack).digest != result.digest
    assert simulate(cfg, AttackConfig().validate(cfg)).digest != result.digest


def test_optimised_alie_searches_against_the_servers_bucketing(tmp_path: Path) -> None:
    """The optimised ALIE's line search runs the servers' bucketing shuffle (per round and
    shard) and rule in every Byzantine process: all forge the same vectors, which are the
    engine's."""
    attack = AttackConfig.build(worker_attack="alie-opt", byzantine_workers=BYZANTINE,
                                alie_opt_evals=6)
    _run(tmp_path, attack, rounds=8, rule="trimmed-mean", q=1, pre="bucketing")
