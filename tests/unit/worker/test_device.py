"""``--device`` (``worker/device.py``): the CPU path everywhere, the one-line refusal of
CUDA where there is none, and (marked ``cuda``, skipped without a GPU) the device path:
deterministic gradients, pinned host vectors, the engine bit for bit run after run."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from common.errors import EXIT_CONFIG, ConfigError
from common.learn.data import load_dataset
from common.run.buffers import HostBuffers
from common.run.config import AttackConfig, RunConfig
from common.run.model_init import initial_parameters
from ps.reference.engine import simulate
from worker.device import check_device, cuda_devices, resolve_device, select_device
from worker.trainer import GradientComputer, cross_entropy

NO_CUDA = cuda_devices() == 0
CFG = RunConfig(dataset="synthetic", model="cnn", num_workers=3, num_shards=2,
                rule="marmed", rounds=3).validate()


@pytest.mark.parametrize("spec", ["cpu", "cuda", "cuda:0", "cuda:12", "auto"])
def test_the_device_names_taken(spec: str) -> None:
    assert check_device(spec) == spec


@pytest.mark.parametrize("spec", ["gpu", "cuda:", "cuda:x", "CPU", "cuda:-1", "mps"])
def test_other_device_names_are_refused_in_one_line(spec: str) -> None:
    with pytest.raises(ConfigError, match="expected cpu, cuda, cuda:N"):
        check_device(spec)


def test_cpu_is_the_cpu_and_auto_is_the_cpu_without_a_gpu() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    if NO_CUDA:
        assert resolve_device("auto") == torch.device("cpu")
    else:
        assert resolve_device("auto").type == "cuda"


@pytest.mark.skipif(not NO_CUDA, reason="checks the refusal where there is no CUDA")
@pytest.mark.parametrize("spec", ["cuda", "cuda:1"])
def test_cuda_where_there_is_none_is_a_configuration_error(spec: str) -> None:
    with pytest.raises(ConfigError, match=f"--device {spec}: no CUDA device: torch "):
        select_device(spec)


@pytest.mark.skipif(not NO_CUDA, reason="checks the refusal where there is no CUDA")
@pytest.mark.parametrize("command", [
    ["ps.reference.cli", "--dataset", "synthetic", "--rounds", "1"],
    ["worker.cli", "--dataset", "synthetic", "--worker-id", "0", "--insecure",
     "--servers", "tcp://127.0.0.1:9", "--timeout", "1", "--retries", "0"],
    ["ps.launcher.cli", "--dataset", "synthetic", "--rounds", "1", "--insecure"],
])
def test_every_command_refuses_cuda_where_there_is_none_in_one_line(
        command: list[str], tmp_path) -> None:
    """ps-simulate, ps-worker and ps-cluster: exit 2 and one line, before anything runs
    (the cluster starts no process: its output directory stays empty)."""
    done = subprocess.run([sys.executable, "-m", *command, "--device", "cuda",
                           "--out-dir", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == EXIT_CONFIG, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--device cuda: no CUDA device" in lines[0], done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out" / "server-0.jsonl").exists()


def test_the_gradient_on_the_cpu_device_is_the_plain_one_into_a_given_vector() -> None:
    data = load_dataset(CFG.dataset, seed=CFG.seed)
    x = initial_parameters(CFG)
    plain, loss = GradientComputer(CFG, data).gradient(x, 1, 2)
    computer = GradientComputer(CFG, data, resolve_device("cpu"))
    out = np.full(computer.d, np.nan, dtype=np.float32)
    g, same_loss = computer.gradient(x, 1, 2, out=out)
    assert g is out and np.array_equal(g.view(np.uint32), plain.view(np.uint32))
    assert same_loss == loss
    with pytest.raises(ValueError, match="gradient's vector must be float32"):
        computer.gradient(x, 1, 2, out=np.empty(computer.d, dtype=np.float64))


def test_the_loss_is_torch_s_cross_entropy_on_the_cpu() -> None:
    logits, targets = torch.randn(8, 10), torch.randint(0, 10, (8,))
    for reduction in ("mean", "sum"):
        assert torch.equal(cross_entropy(logits, targets, reduction),
                           torch.nn.functional.cross_entropy(logits, targets,
                                                             reduction=reduction))


# ------------------------------------------------------------------------ on a GPU


@pytest.mark.cuda
def test_cuda_gradients_are_deterministic_and_close_to_the_cpu_s() -> None:
    data = load_dataset(CFG.dataset, seed=CFG.seed)
    x = initial_parameters(CFG)
    device = resolve_device("cuda:0")
    first = GradientComputer(CFG, data, device)
    second = GradientComputer(CFG, data, device)
    pinned = HostBuffers(first.d, pinned=True)
    a, loss_a = first.gradient(x, 2, 1, out=pinned.take())
    b, loss_b = second.gradient(x, 2, 1, out=pinned.take())
    assert torch.from_numpy(a).is_pinned()
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32)) and loss_a == loss_b
    on_cpu, loss_cpu = GradientComputer(CFG, data).gradient(x, 2, 1)
    np.testing.assert_allclose(a, on_cpu, rtol=1e-3, atol=1e-5)
    assert abs(loss_a - loss_cpu) < 1e-4


@pytest.mark.cuda
def test_the_loss_on_cuda_is_cross_entropy() -> None:
    logits, targets = torch.randn(8, 10), torch.randint(0, 10, (8,))
    on_gpu = cross_entropy(logits.cuda(), targets.cuda())
    assert torch.allclose(on_gpu.cpu(), torch.nn.functional.cross_entropy(logits, targets))


@pytest.mark.cuda
@pytest.mark.parametrize("model", ["cnn", "resnet18"])
def test_the_engine_on_cuda_ends_bit_identical_run_after_run(model: str) -> None:
    cfg = RunConfig(dataset="synthetic-cifar", model=model, num_workers=4, num_shards=2,
                    rule="meamed", q=1, rounds=3).validate()
    attack = AttackConfig().validate(cfg)
    runs = [simulate(cfg, attack, device=resolve_device("cuda")) for _ in range(2)]
    assert runs[0].digest == runs[1].digest
    assert np.isfinite(runs[0].params).all()
