"""GPU services in the generated deployments: with ``PS_DEVICE=cuda`` in the env file the
workers and the evaluator (and only they) ask the runtime for the host's GPUs (compose:
a device request of the NVIDIA Container Toolkit; swarm: a generic resource the GPU
nodes advertise), and ``PS_DEVICE`` reaches their environment; the CPU default asks for
none. The compose file is checked as YAML, and by ``docker-compose config`` where
installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ps.deploy.compose import GPU_REQUEST, deployment, read_env, render
from ps.deploy.stack import GPU_RESOURCE, stack_spec

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[3]
OPTIONS = {"env_file": "docker/cluster.env", "proxy_shards": [0], "byzantine_workers": [],
           "worker_attack": "gaussian"}


def _dep(device: str | None):
    env = read_env(ROOT / "docker" / "cluster.env")
    if device is not None:
        env["PS_DEVICE"] = device
    return deployment(env, OPTIONS)


def _gpu_of(service: dict) -> list:
    return service.get("deploy", {}).get("resources", {}).get("reservations", {}).get(
        "devices", [])


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_compose_gives_the_workers_and_the_evaluator_the_gpus(device: str,
                                                             tmp_path: Path) -> None:
    text = render(_dep(device), OPTIONS)
    services = yaml.safe_load(text)["services"]
    for name, service in services.items():
        wants = name.startswith(("worker-", "evaluator"))
        assert _gpu_of(service) == ([GPU_REQUEST] if wants else []), name
        if wants:
            assert service["environment"]["PS_DEVICE"] == device
    assert any(name.startswith("worker-") for name in services)
    if shutil.which("docker-compose"):  # what docker-compose v1 reads of it
        (tmp_path / "docker-compose.yml").write_text(text)
        (tmp_path / "Dockerfile").write_text("FROM scratch\n")
        done = subprocess.run(["docker-compose", "config", "-q"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("device", [None, "cpu", "auto"])
def test_no_gpu_is_asked_for_unless_cuda_is(device: str | None) -> None:
    services = yaml.safe_load(render(_dep(device), OPTIONS))["services"]
    assert not any(_gpu_of(s) for s in services.values())
    stack = stack_spec(_dep(device))["services"]
    assert not any("reservations" in s["deploy"]["resources"] for s in stack.values())


def test_the_stack_places_gpu_services_on_nodes_that_advertise_a_gpu() -> None:
    services = stack_spec(_dep("cuda"))["services"]
    for name, service in services.items():
        reservations = service["deploy"]["resources"].get("reservations")
        if name.startswith(("worker-", "evaluator")):
            assert reservations == {"generic_resources": [
                {"discrete_resource_spec": {"kind": GPU_RESOURCE, "value": 1}}]}
            assert service["environment"]["PS_DEVICE"] == "cuda"
        else:
            assert reservations is None, name
