"""A cluster whose workers compute on a GPU (``--device cuda``) against the reference
engine on the same GPU: bit-identical, with float32 and with bfloat16 on the wire, keys
on. Marked ``cuda``: skipped where torch sees no GPU (``scripts/gpu_check.sh`` runs it).

The cluster runs as its own process (``python -m ps.launcher.cli``): it forks its workers
from itself, which CUDA allows only from a process that has not used it yet, and this
test process may have."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from common.run.config import AttackConfig, RunConfig
from ps.reference.engine import simulate
from worker.device import resolve_device

pytestmark = [pytest.mark.integration, pytest.mark.cuda]


@pytest.mark.parametrize("wire", ["float32", "bfloat16"])
def test_a_cluster_on_the_gpu_ends_bit_identical_to_the_engine_on_it(
        tmp_path: Path, wire: str) -> None:
    settings = {"model": "cnn", "dataset": "synthetic-cifar", "num_workers": 4,
                "num_shards": 2, "rule": "meamed", "q": 1, "rounds": 6, "wire_dtype": wire}
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "ps.launcher.cli", "--model", "cnn", "--dataset",
         "synthetic-cifar", "--workers", "4", "--shards", "2", "--rule", "meamed", "--q",
         "1", "--rounds", "6", "--wire-dtype", wire, "--device", "cuda", "--eval-every",
         "3", "--worker-processes", "2", "--run-timeout", "240", "--out-dir", str(out)],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "on cuda:" in (out / "logs" / "worker-0.log").read_text()
    cfg = RunConfig(**settings).validate()
    reference = simulate(cfg, AttackConfig().validate(cfg), device=resolve_device("cuda"))
    assert json.loads((out / "summary.json").read_text())["params_sha256"] == reference.digest
