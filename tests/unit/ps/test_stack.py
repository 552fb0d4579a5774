"""The Docker Swarm stack (``docker/stack.yml``, ``ps/deploy/stack.py``).

The stack is derived from ``docker/cluster.env`` like the compose file: the services
(one per worker, its id fixed), the keys as secrets (each service exactly the key files
its process loads, none in an environment), placement, restart policy and volumes;
``docker/gen_stack.py --check`` keeps the committed file current. Most tests here read
the gambler experiment (``docker/experiments/gambler.env`` over the env file: a proxy in
front of server 0), the shipped file having none. (What each container can read and
write and its limits: ``tests/unit/ps/test_deploy_isolation.py``; the shipped files and
the experiments: ``tests/unit/ps/test_deploy_experiment.py``.)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from common.errors import ConfigError
from common.net.keys import KeyRing, create_keys, needed_keys
from common.net.sharding import parse_servers
from ps.deploy.compose import (
    Deployment,
    deployment,
    deployment_of,
    options_env,
    service_environments,
)
from ps.deploy.stack import (
    ARGS_MARK,
    KEYS_MARK,
    SECRETS_DIR,
    main,
    render,
    service_keys,
    stack_spec,
)
from server.options import ServerOptions

ROOT = Path(__file__).resolve().parents[3]
ENV_FILE = ROOT / "docker" / "cluster.env"
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
SHIPPED = {"env_file": "docker/cluster.env", "experiment": None, "proxy_shards": [0],
           "byzantine_workers": [], "worker_attack": "gaussian"}
# the gambler experiment: a proxy (and its key) before server 0
DEFAULT = {**SHIPPED, "experiment": "docker/experiments/gambler.env"}
Z85 = re.compile(r"^[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}$")


def _dep(**options: Any) -> Deployment:
    return deployment_of({**DEFAULT, **options})


def _services(**options: Any) -> dict[str, Any]:
    return stack_spec(_dep(**options))["services"]


def test_services_replicas_and_network() -> None:
    dep = _dep()
    n, s = dep.cfg.num_workers, dep.cfg.num_shards
    spec = stack_spec(dep)
    services = spec["services"]
    assert list(services) == [*(f"server-{k}" for k in range(s)), "proxy-0",
                              *(f"worker-{i}" for i in range(n)), "evaluator"]
    for service in services.values():
        assert service["deploy"]["replicas"] == 1
        assert service["networks"] == ["byzps"]
        assert service["deploy"]["endpoint_mode"] == "dnsrr"
        assert service["environment"]["PS_WORKERS"] == str(n)
        assert "PS_LOG_NAME" not in service["environment"]
    assert spec["networks"] == {"byzps": {"driver": "overlay", "attachable": True}}
    # servers by their stable names; the workers reach shard 0 through its proxy
    for i in range(n):
        assert services[f"worker-{i}"]["environment"]["PS_SERVERS"] == ",".join(
            ["tcp://proxy-0:5550", *(f"tcp://server-{k}:5550" for k in range(1, s))])
    assert services["evaluator"]["environment"]["PS_SERVERS"] == ",".join(
        f"tcp://server-{k}:5550" for k in range(s))
    assert services["proxy-0"]["environment"]["PS_PROXY_SERVER"] == "tcp://server-0:5550"
    assert services["proxy-0"]["environment"]["PS_PROXY_ATTACK"] == "gambler"
    assert "healthcheck" in services["server-0"] and "healthcheck" not in services["worker-0"]

    for options in ({**DEFAULT, "proxy_shards": []}, SHIPPED):  # no proxy, no proxy key
        no_proxy = stack_spec(deployment_of(options))
        assert "proxy-0" not in no_proxy["services"]
        assert no_proxy["services"]["worker-0"]["environment"]["PS_SERVERS"].startswith(
            "tcp://server-0:5550")
        assert "proxy-0.key" not in no_proxy["secrets"]


def _entrypoint(env: dict[str, str], *command: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(["bash", str(ENTRYPOINT), *command], env={**base, **env},
                          capture_output=True, text=True, timeout=120, check=False)


def test_each_worker_service_has_its_fixed_id() -> None:
    services = _services()
    for i in range(8):
        env = services[f"worker-{i}"]["environment"]
        assert env["PS_WORKER_ID"] == str(i)
        assert "PS_WORKER_SLOT" not in env and "PS_WORKER_ATTACK" not in env


def test_byzantine_workers_through_the_generator_options() -> None:
    services = _services(byzantine_workers=[6, 7], worker_attack="alie")
    for i in range(8):
        env = services[f"worker-{i}"]["environment"]
        if i in (6, 7):
            assert env["PS_WORKER_ATTACK"] == "alie" and env["PS_BYZANTINE_WORKERS"] == "6,7"
        else:
            assert "PS_WORKER_ATTACK" not in env


@pytest.mark.parametrize("worker", [0, 6])
def test_a_worker_of_a_byzantine_stack_passes_the_worker_checks(worker: int,
                                                                tmp_path: Path) -> None:
    """ps-worker itself accepts the service's environment, through the image's
    entrypoint: it gets past its configuration checks and gives up on the unreachable
    servers (exit 4, not 2)."""
    env = dict(_services(byzantine_workers=[6, 7], worker_attack="alie")[f"worker-{worker}"]
               ["environment"])
    del env["PS_KEYS"]
    env.update({"PS_INSECURE": "1", "PS_DATASET": "synthetic",
                "PS_SERVERS": ",".join(["tcp://127.0.0.1:9"] * 4), "PS_TIMEOUT": "0.2",
                "PS_RETRIES": "0", "PS_OUT_DIR": str(tmp_path)})
    done = _entrypoint(env, sys.executable, "-m", "worker.cli")
    assert done.returncode == 4, done.stdout + done.stderr
    log = done.stdout + done.stderr
    assert "no reply" in log and "not in --byzantine-workers" not in log


EXPECTED_KEYS = {
    "server-0": ["server-0.key_secret", *(f"worker-{i}.key" for i in range(8)),
                 "evaluator.key", "proxy-0.key"],
    "server-1": ["server-1.key_secret", *(f"worker-{i}.key" for i in range(8)),
                 "evaluator.key"],
    # the proxy: its own secret only (nothing of server-0's: it cannot pose as it)
    "proxy-0": ["proxy-0.key_secret", "server-0.key", *(f"worker-{i}.key" for i in range(8))],
    "worker-3": ["worker-3.key_secret", *(f"server-{k}.key" for k in range(4)), "proxy-0.key"],
    "evaluator": ["evaluator.key_secret", *(f"server-{k}.key" for k in range(4))],
}


def test_secrets_per_service(tmp_path: Path) -> None:
    dep = _dep()
    spec = stack_spec(dep)
    keys = service_keys(dep)
    for name, files in EXPECTED_KEYS.items():
        assert keys[name] == files
    for name, service in spec["services"].items():
        assert [m["source"] for m in service["secrets"]] == keys[name]
        assert service["environment"]["PS_KEYS"] == str(SECRETS_DIR) == "/run/secrets/keys"
        for mount in service["secrets"]:
            assert mount["target"] == f"/run/secrets/keys/{mount['source']}"
            assert (mount["uid"], mount["gid"]) == ("1000", "1000")
            assert mount["mode"] == (0o400 if mount["source"].endswith("_secret") else 0o444)
        assert sum(m["source"].endswith(".key_secret") for m in service["secrets"]) == 1
    # the secrets the stack declares are the files `ps-keys` writes with the header's
    # arguments, all external and named <prefix>-<file>
    text = render(dep, DEFAULT)
    arguments = next(line for line in text.splitlines() if line.startswith(KEYS_MARK))
    assert arguments == KEYS_MARK + "--shards 4 --workers 8 --proxies 0"
    create_keys(tmp_path, 4, 8, proxies=(0,))
    declared = spec["secrets"]
    assert set(declared) == set(os.listdir(tmp_path))
    assert set(declared) == {m["source"] for s in spec["services"].values()
                             for m in s["secrets"]}
    for file, secret in declared.items():
        assert secret == {"external": True, "name": "${PS_SECRET_PREFIX:-byzps}-" + file}
    # scripts/swarm_secrets.sh reads the same list from a stack file: the experiment's
    # (written here) and the committed one (no proxy key)
    out = tmp_path / "gambler.stack.yml"
    out.write_text(text)
    for stack_file, secrets in ((out, list(declared)),
                                (ROOT / "docker" / "stack.yml",
                                 list(stack_spec(deployment_of(SHIPPED))["secrets"]))):
        done = subprocess.run(["bash", str(ROOT / "scripts" / "swarm_secrets.sh"), "files"],
                              capture_output=True, text=True, timeout=60, check=True,
                              env={**os.environ, "PS_STACK_FILE": str(stack_file)})
        assert done.stdout.split() == secrets, stack_file
    assert not any(name.startswith("proxy-") for name in secrets)


def _load(service: str, ring: KeyRing, dep: Deployment) -> Any:
    """What the process of ``service`` loads from its key directory."""
    s = dep.cfg.num_shards
    if service.startswith("server-"):
        curve = ring.server_curve(int(service.split("-")[1]), dep.cfg.num_workers)
        return curve.public, curve.secret, sorted(i.name for i in curve.clients.values())
    if service.startswith("proxy-"):
        k = int(service.split("-")[1])
        front = ring.front_curve(k, dep.cfg.num_workers)
        return (ring.client_curve(service, k), front.secret,
                sorted(i.name for i in front.clients.values()))
    if service.startswith("worker-"):
        worker = int(service.split("-")[1])
        return [(ring.client_curve(service, k, via_proxy=k in dep.proxied),
                 ring.worker_relay_key(worker, k)) for k in range(s)]
    return [ring.client_curve("evaluator", k) for k in range(s)]


def _misses(service: str, directory: Path, dep: Deployment, full: Any) -> bool:
    """Whether the process of ``service`` fails to load, or loads less, from ``directory``."""
    try:
        return _load(service, KeyRing(directory), dep) != full
    except ConfigError:
        return True


def test_each_service_gets_exactly_the_keys_its_process_loads(tmp_path: Path) -> None:
    dep = _dep()
    everything = tmp_path / "all"
    create_keys(everything, 4, 8, proxies=(0,))
    for service, files in service_keys(dep).items():
        directory = tmp_path / service
        directory.mkdir()
        for file in files:
            shutil.copy(everything / file, directory / file)
        full = _load(service, KeyRing(directory), dep)
        if service.startswith(("server-", "proxy-")):
            admitted = full[2]
            workers = [f"worker-{i}" for i in range(8)]
            assert admitted == sorted(
                workers if service.startswith("proxy-")
                else [*workers, "evaluator", *(["proxy-0"] if service == "server-0" else [])])
        for file in files:  # without any one of them the process misses something
            (directory / file).unlink()
            assert _misses(service, directory, dep, full), (service, file)
            shutil.copy(everything / file, directory / file)


def test_no_key_material_in_any_environment(tmp_path: Path) -> None:
    create_keys(tmp_path, 4, 8, proxies=(0,))
    material = {m.group(1) for f in tmp_path.iterdir()
                for m in re.finditer(r'-key = "(.{40})"', f.read_text())}
    assert len(material) == 2 * 14  # 14 identities: a public and a secret key each
    for options in (DEFAULT, {**DEFAULT, "byzantine_workers": [6, 7], "worker_attack": "alie"}):
        spec = stack_spec(_dep(**options))
        for name, service in spec["services"].items():
            for key, value in service["environment"].items():
                assert not Z85.match(value), (name, key)
                assert "KEY" not in key or key == "PS_KEYS", (name, key)
        assert not any(m in render(_dep(**options), options) for m in material)


def test_placement_restart_policy_and_volumes() -> None:
    spec = stack_spec(_dep())
    for name, service in spec["services"].items():
        assert service["deploy"]["restart_policy"] == {
            "condition": "on-failure", "delay": "5s", "max_attempts": 3}
        assert service["volumes"][0] == f"runs-{name}:/runs"  # its own volume
        assert service["environment"]["PS_OUT_DIR"] == "/runs"
        assert service["cap_drop"] == ["ALL"]
        assert ("placement" in service["deploy"]) == name.startswith("worker-")
    assert spec["services"]["worker-0"]["deploy"]["placement"] == {
        "preferences": [{"spread": "node.labels.zone"}]}
    assert spec["volumes"] == {f"runs-{name}": {} for name in spec["services"]}
    # a restarted server resumes its checkpoint
    assert spec["services"]["server-0"]["environment"]["PS_RESUME"] == "1"


def test_rendered_yaml_is_the_spec() -> None:
    yaml = pytest.importorskip("yaml")
    for options in (DEFAULT, {**DEFAULT, "proxy_shards": []},
                    {**DEFAULT, "byzantine_workers": [6, 7], "worker_attack": "alie"}):
        dep = _dep(**options)
        text = render(dep, options)
        assert yaml.safe_load(text) == stack_spec(dep)
        assert "mode: 0400" in text and "mode: 0444" in text


def test_check_passes_on_the_committed_stack_file() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "docker" / "gen_stack.py"), "--check"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "up to date" in done.stdout


def test_check_detects_a_changed_env_file(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    env = tmp_path / "cluster.env"
    shutil.copy(ENV_FILE, env)
    out = tmp_path / "stack.yml"
    assert main(["--env-file", str(env), "-o", str(out)]) == 0
    assert ARGS_MARK in out.read_text()
    assert main(["--check", "-o", str(out)]) == 0
    for key, value in (("PS_WORKERS", "6"), ("PS_LR", "0.05")):
        original = env.read_text()
        env.write_text(re.sub(rf"^{key}=.*$", f"{key}={value}", original, flags=re.M))
        capsys.readouterr()
        assert main(["--check", "-o", str(out)]) == 1
        assert "stale" in capsys.readouterr().err
        env.write_text(original)
        assert main(["--check", "-o", str(out)]) == 0
    env.write_text(re.sub(r"^PS_WORKERS=.*$", "PS_WORKERS=6", env.read_text(), flags=re.M))
    assert main(["--env-file", str(env), "-o", str(out)]) == 0
    assert "  worker-5:" in out.read_text() and "  worker-6:" not in out.read_text()
    env.write_text(env.read_text() + "PS_NOT_A_SETTING=1\n")
    assert main(["--check", "-o", str(out)]) == 2


# --- fewer server processes than shards (PS_SERVER_PROCESSES) --------------------------

def _blocks_dep(processes: str | None = "2", **options: Any) -> Deployment:
    """The default env file with ``PS_SERVER_PROCESSES`` set (None: left out)."""
    env = {k: v for k, v in options_env(DEFAULT).items() if k != "PS_SERVER_PROCESSES"}
    if processes is not None:
        env["PS_SERVER_PROCESSES"] = processes
    return deployment(env, {**DEFAULT, **options})


def test_two_server_processes_host_four_shards() -> None:
    """S=4, P=2: services server-0 (shards 0-1) and server-2 (2-3), named by their first
    shard; one endpoint per process in every PS_SERVERS; the proxy of shard 0 fronts the
    process hosting it, corrupting shard 0 alone."""
    dep = _blocks_dep()
    assert dep.cfg.num_shards == 4
    assert dep.blocks == ((0, 1), (2, 3)) and dep.proxied == (0,)
    services = stack_spec(dep)["services"]
    assert list(services) == ["server-0", "server-2", "proxy-0",
                              *(f"worker-{i}" for i in range(8)), "evaluator"]
    env = {name: service["environment"] for name, service in services.items()}
    assert env["server-0"]["PS_SHARD"] == "0-1" and env["server-2"]["PS_SHARD"] == "2-3"
    # what ps-server makes of it: the hosted shards
    assert ServerOptions(shard=env["server-2"]["PS_SHARD"]).shards(dep.cfg) == (2, 3)
    assert env["proxy-0"]["PS_PROXY_SERVER"] == "tcp://server-0:5550"
    assert env["proxy-0"]["PS_PROXY_SHARD"] == "0-1"
    assert env["proxy-0"]["PS_PROXY_SHARDS"] == "0"
    for i in range(8):
        servers = env[f"worker-{i}"]["PS_SERVERS"]
        assert servers == "tcp://proxy-0:5550,tcp://server-2:5550"
        # what ps-worker makes of it: each endpoint hosts its block, in shard order
        assert parse_servers(servers, 4) == [((0, 1), "tcp://proxy-0:5550"),
                                             ((2, 3), "tcp://server-2:5550")]
    assert env["evaluator"]["PS_SERVERS"] == "tcp://server-0:5550,tcp://server-2:5550"
    assert all("PS_SERVER_PROCESSES" not in e for e in env.values())  # a topology setting
    for name in ("server-0", "server-2", "proxy-0"):
        assert "healthcheck" in services[name]
    assert set(stack_spec(dep)["volumes"]) == {f"runs-{name}" for name in services}


def test_two_server_processes_secrets_are_the_needed_keys_of_process_names(
        tmp_path: Path) -> None:
    """Each service gets needed_keys of its own name, the proxies named by the process
    they front; the header's ps-keys arguments write every secret the stack declares,
    and each service's secrets are enough for what its process loads."""
    dep = _blocks_dep()
    spec = stack_spec(dep)
    keys = service_keys(dep)
    for name, service in spec["services"].items():
        assert keys[name] == needed_keys(name, 4, 8, [0]), name
        assert [m["source"] for m in service["secrets"]] == keys[name]
    assert "proxy-0.key" in keys["server-0"] and "proxy-0.key" not in keys["server-2"]
    assert keys["proxy-0"][:2] == ["proxy-0.key_secret", "server-0.key"]
    text = render(dep, DEFAULT)
    assert KEYS_MARK + "--shards 4 --workers 8 --proxies 0" in text.splitlines()
    assert "4 shards on 2 server processes (0-1, 2-3)" in text
    everything = tmp_path / "all"
    create_keys(everything, 4, 8, proxies=dep.proxied)
    assert set(spec["secrets"]) <= set(os.listdir(everything))
    assert "server-1.key_secret" not in spec["secrets"]  # no process speaks as server-1
    for service, files in keys.items():
        directory = tmp_path / service
        directory.mkdir()
        for file in files:
            shutil.copy(everything / file, directory / file)
        ring = KeyRing(directory)
        if service.startswith("server-"):
            ring.server_curve(int(service.split("-")[1]), 8)
        elif service.startswith("proxy-"):
            ring.client_curve(service, 0)
            ring.front_curve(0, 8)
        else:
            for first in (0, 2):
                ring.client_curve(service, first)


def test_proxies_before_two_server_processes_corrupt_their_own_shards() -> None:
    """--proxy-shards 0,3 over blocks 0-1 and 2-3: proxy-0 corrupts shard 0, proxy-2
    shard 3; every worker reaches both processes through their proxies."""
    dep = _blocks_dep(proxy_shards=[0, 3])
    assert dep.proxied == (0, 2)
    services = stack_spec(dep)["services"]
    assert [name for name in services if name.startswith("proxy-")] == ["proxy-0", "proxy-2"]
    env = {name: service["environment"] for name, service in services.items()}
    assert (env["proxy-0"]["PS_PROXY_SHARD"], env["proxy-0"]["PS_PROXY_SHARDS"]) == ("0-1", "0")
    assert (env["proxy-2"]["PS_PROXY_SHARD"], env["proxy-2"]["PS_PROXY_SHARDS"]) == ("2-3", "3")
    assert env["proxy-2"]["PS_PROXY_SERVER"] == "tcp://server-2:5550"
    assert env["worker-0"]["PS_SERVERS"] == "tcp://proxy-0:5550,tcp://proxy-2:5550"
    assert service_keys(dep)["server-2"] == needed_keys("server-2", 4, 8, [0, 2])
    assert "proxy-2.key" in service_keys(dep)["server-2"]
    assert KEYS_MARK + "--shards 4 --workers 8 --proxies 0,2" in render(
        dep, {**DEFAULT, "proxy_shards": [0, 3]}).splitlines()
    # a proxied shard that is not a process's first: the proxy is still named by it
    one = _blocks_dep(proxy_shards=[3])
    assert one.proxied == (2,) and "proxy-2" in stack_spec(one)["services"]
    assert stack_spec(one)["services"]["proxy-2"]["environment"]["PS_PROXY_SHARDS"] == "3"


def test_server_processes_default_and_range() -> None:
    """Left out, PS_SERVER_PROCESSES is min(S, 4), as ps-cluster's default; P = S is one
    shard per process, as before; more processes than shards, or none, is refused."""
    assert _blocks_dep(None).blocks == ((0,), (1,), (2,), (3,))
    assert _blocks_dep("4").blocks == ((0,), (1,), (2,), (3,))
    env = {**options_env(DEFAULT), "PS_SHARDS": "8"}
    env.pop("PS_SERVER_PROCESSES")
    assert deployment(env, DEFAULT).blocks == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert list(service_environments(_blocks_dep("1"))) == [
        "server-0", "proxy-0", *(f"worker-{i}" for i in range(8)), "evaluator"]
    assert service_environments(_blocks_dep("1"))["server-0"][1]["PS_SHARD"] == "0-3"
    for bad in ("5", "0", "two"):
        with pytest.raises(ConfigError, match=r"PS_SERVER_PROCESSES|--server-processes"):
            _blocks_dep(bad)
