"""The generated files are data written with PyYAML, and the generators click commands.

``ps.deploy.compose.compose_spec`` and ``ps.deploy.stack.stack_spec`` build each file as
Python data; ``ps.deploy.yamlfile.dump`` writes it after the header of comments. For
several topologies (the shipped settings; a Byzantine worker; two server processes;
``PS_DEVICE=cuda``; the gambler experiment, alone and over two server processes with
two proxies) the file as YAML reads back to the structure each service must have (its
environment exactly the run configuration plus what its role takes, its mounts,
limits, start order, healthcheck and GPU request), and keeps its readable anchors:
``x-node: &node`` merged into every service, ``x-run: &run`` into every node's
environment, ``x-ready: &ready`` the servers' and proxies' healthcheck, one shared
``depends_on`` block per set of dependencies. ``docker-compose config`` accepts them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ps.deploy import compose, stack
from ps.deploy.compose import (
    GPU_REQUEST,
    deployment,
    deployment_sizes,
    keys_arguments,
    options_env,
    recorded_options,
    render,
    runs_dir_script,
    service_environments,
    service_limits,
)
from ps.deploy.yamlfile import MERGE, Anchored, Flow, FlowMap, Literal, Octal, Quoted, dump

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = {"env_file": "docker/cluster.env", "experiment": None, "proxy_shards": [0],
           "byzantine_workers": [], "worker_attack": "gaussian"}
GAMBLER = {**SHIPPED, "experiment": "docker/experiments/gambler.env"}
# name -> (topology options, settings on top of the env files)
TOPOLOGIES = {
    "shipped": (SHIPPED, {}),
    "byzantine": ({**SHIPPED, "byzantine_workers": [7]}, {}),
    "two-processes": (SHIPPED, {"PS_SERVER_PROCESSES": "2"}),
    "cuda": (SHIPPED, {"PS_DEVICE": "cuda"}),
    "gambler": (GAMBLER, {}),
    "gambler-two-processes": ({**GAMBLER, "proxy_shards": [0, 3]},
                              {"PS_SERVER_PROCESSES": "2"}),
}
RUNS = "${PS_RUNS_DIR:-./runs/compose}"


def _dep(name: str) -> Any:
    options, extra = TOPOLOGIES[name]
    return deployment({**options_env(options), **extra}, options), options


def _header(text: str) -> list[str]:
    head = text.split("\nversion:", 1)[0].splitlines()
    assert head and all(line.startswith("#") for line in head)
    return head


# --- the compose file -------------------------------------------------------------------

@pytest.mark.parametrize("name", TOPOLOGIES)
def test_compose_file_reads_back_to_each_services_structure(name: str, tmp_path: Path) -> None:
    dep, options = _dep(name)
    text = render(dep, options)
    (tmp_path / "compose.yml").write_text(text)
    assert recorded_options(tmp_path / "compose.yml", compose.ARGS_MARK) == options
    _header(text)
    data = yaml.safe_load(text)
    assert list(data) == ["version", "x-node", "x-run", "x-ready", "services"]
    assert data["version"] == "2.4"
    node, run, ready = data["x-node"], data["x-run"], data["x-ready"]
    assert node["read_only"] is True and node["cap_drop"] == ["ALL"]
    assert node["security_opt"] == ["no-new-privileges:true"]
    assert node["user"] == "${PS_UID:-1000}:${PS_GID:-1000}" and node["restart"] == "no"
    assert ready["test"] == ["CMD", "test", "-f", "/tmp/ps-ready"]
    assert run["PS_WORKERS"] == str(dep.cfg.num_workers)
    assert all(isinstance(v, str) for v in run.values())
    environments = service_environments(dep)
    services = data["services"]
    assert list(services) == ["runs-dir", "keys", *environments]
    limits = service_limits(dep, deployment_sizes(dep))
    for svc, service in services.items():
        for key, value in node.items():  # <<: *node, then its own keys on top
            if not (svc == "runs-dir" and key == "user") and not (
                    svc in environments and key == "restart"):
                assert service[key] == value, (svc, key)
        memory = f"{limits[svc][0] >> 20}m"
        assert (service["mem_limit"], service["memswap_limit"], service["pids_limit"]) == (
            memory, memory, limits[svc][1]), svc
    servers = list(dep.servers)
    proxies = [f"proxy-{k}" for k in dep.proxied]
    gpu = dep.settings(compose.ClientOptions, "worker").device.startswith("cuda")
    for svc, (command, env) in environments.items():
        service = services[svc]
        kind = svc.split("-")[0]
        assert service["command"] == [command]
        assert service["restart"] == "on-failure:3"
        assert service["environment"] == {**run, **env}, svc  # exactly: <<: *run + its own
        assert all(isinstance(v, str) for v in service["environment"].values()), svc
        assert service["volumes"] == [f"{RUNS}/{svc}:/runs", f"{RUNS}/keys/{svc}:/keys:ro"]
        needs = ([f"server-{svc.split('-')[1]}"] if kind == "proxy" else
                 {"server": ["keys"], "worker": servers + proxies, "evaluator": servers}[kind])
        assert service["depends_on"] == {
            d: {"condition": "service_completed_successfully" if d == "keys"
                else "service_healthy"} for d in needs}, svc
        assert service.get("healthcheck") == (ready if kind in ("server", "proxy") else None)
        wants_gpu = gpu and kind in ("worker", "evaluator")
        assert service.get("deploy") == (
            {"resources": {"reservations": {"devices": [GPU_REQUEST]}}} if wants_gpu
            else None), svc
        if kind == "worker":
            lies = int(svc.split("-")[1]) in options["byzantine_workers"]
            assert ("PS_WORKER_ATTACK" in service["environment"]) == lies, svc
    runs_dir, keys = services["runs-dir"], services["keys"]
    assert runs_dir["build"] == {"context": ".", "args": {"TORCH_INDEX_URL":
                                                           "${TORCH_INDEX_URL:-}"}}
    assert runs_dir["user"] == "0:0" and runs_dir["network_mode"] == "none"
    assert runs_dir["volumes"] == [f"{RUNS}:/runs"]
    assert runs_dir["command"] == ["sh", "-c", runs_dir_script(dep) + "\n"]
    assert keys["command"] == ["ps-keys", "--force", "--dir", "/tmp/keys", "--bundles",
                               "/keys", *keys_arguments(dep)]
    assert keys["depends_on"] == {"runs-dir": {"condition": "service_completed_successfully"}}
    assert bool(proxies) == name.startswith("gambler")


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_compose_file_keeps_its_named_anchors(name: str) -> None:
    dep, options = _dep(name)
    text = render(dep, options)
    lines = text.splitlines()
    environments = service_environments(dep)
    for anchor in ("x-node: &node", "x-run: &run", "x-ready: &ready"):
        assert anchor in lines
    assert lines.count("    <<: *node") == 2 + len(environments)  # every service
    assert lines.count("      <<: *run") == len(environments)  # every node's environment
    assert lines.count("    healthcheck: *ready") == len(dep.servers) + len(dep.proxied)
    workers = [s for s in environments if s.startswith("worker-")]
    assert "    depends_on: &worker-0-deps" in lines
    # the evaluator's is the workers' when there is no proxy to wait for
    assert lines.count("    depends_on: *worker-0-deps") == len(workers) - 1 + (
        0 if dep.proxied else 1)
    first_server = next(iter(dep.servers))
    assert lines.count(f"    depends_on: *{first_server}-deps") == len(dep.servers) - 1
    assert not re.search(r"[&*]id\d", text)  # no anonymous anchor
    # readable: the services set apart, the runs-dir script a literal block, no wrapping
    assert "\n\n  server-0:\n" in text and "\n\n  evaluator:\n" in text
    assert "\n\n  # the run's CURVE keys" in text  # its comment, then keys:
    assert "    command:\n      - sh\n      - -c\n      - |\n        set -e\n" in text
    assert max(len(line) for line in lines) > 120  # PS_SERVERS etc. on one line each
    assert '  PS_WORKERS: "8"' in lines  # environment values double-quoted
    assert lines.count('      PS_KEYS: "/keys"') == len(environments)


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="no docker-compose")
@pytest.mark.parametrize("name", TOPOLOGIES)
def test_docker_compose_accepts_the_file(name: str, tmp_path: Path) -> None:
    dep, options = _dep(name)
    out = tmp_path / "docker-compose.yml"
    out.write_text(render(dep, options, str(out)))
    done = subprocess.run(["docker-compose", "-f", str(out), "config", "-q"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr


# --- the stack file ---------------------------------------------------------------------

@pytest.mark.parametrize("name", TOPOLOGIES)
def test_stack_file_reads_back_to_its_spec(name: str) -> None:
    dep, options = _dep(name)
    text = stack.render(dep, options)
    _header(text)
    spec = stack.stack_spec(dep)
    assert yaml.safe_load(text) == spec
    lines = text.splitlines()
    # scripts/swarm_secrets.sh reads the secrets' names from these lines
    names = [line for line in lines if re.fullmatch(
        r'    name: "\$\{PS_SECRET_PREFIX:-byzps\}-.*"', line)]
    assert len(names) == len(spec["secrets"]) > 0
    # one line per secret mount, its mode in octal
    mounts = [line for line in lines if line.startswith("      - {source: ")]
    assert len(mounts) == sum(len(s["secrets"]) for s in spec["services"].values())
    assert all(line.endswith(("mode: 0400}", "mode: 0444}")) for line in mounts)
    assert not re.search(r"(^|\s)[&*][\w-]+", text.split("\nversion:", 1)[1])  # no anchors
    for svc, service in spec["services"].items():
        assert all(isinstance(v, str) for v in service["environment"].values()), svc


# --- the YAML writer ------------------------------------------------------------------------

def test_dump_names_anchors_and_aliases_nothing_else() -> None:
    shared = Anchored("shared", {"a": Quoted("1")})
    twice = ["x"]  # a plain list used twice is written twice
    data = {"x-shared": shared, "one": {MERGE: shared, "l": twice, "f": Flow(["p", "q"])},
            "two": {MERGE: shared, "l": twice, "m": FlowMap({"k": Octal(0o400)}),
                    "s": Literal("a\nb\n")}}
    text = dump(data, {"one": ["about one"]}, spaced=())
    assert text == ("x-shared: &shared\n  a: \"1\"\n\n# about one\none:\n  <<: *shared\n"
                    "  l:\n    - x\n  f: [p, q]\n\ntwo:\n  <<: *shared\n  l:\n    - x\n"
                    "  m: {k: 0400}\n  s: |\n    a\n    b\n")
    assert yaml.safe_load(text) == {"x-shared": {"a": "1"}, "one": {"a": "1", "l": ["x"],
                                    "f": ["p", "q"]},
                                    "two": {"a": "1", "l": ["x"], "m": {"k": 256},
                                            "s": "a\nb\n"}}


# --- the generators as click commands -------------------------------------------------------

@pytest.mark.parametrize("module", [compose, stack], ids=["compose", "stack"])
def test_generators_are_click_commands(module: Any, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert module.main(["--help"]) == 0
    out = capsys.readouterr().out
    for option in ("--env-file", "--experiment", "--proxy-shards", "--byzantine-workers",
                   "--worker-attack", "--output", "--check"):
        assert option in out, option
    assert "do not write: exit 1 if the" in " ".join(out.split())
    assert module.main(["--worker-attack", "nope", "-o", str(tmp_path / "x.yml")]) == 2
    assert "Invalid value for '--worker-attack'" in capsys.readouterr().err
    assert module.main(["--proxy-shards", "a,b", "-o", str(tmp_path / "x.yml")]) == 2
    assert "Invalid value for '--proxy-shards'" in capsys.readouterr().err
    assert not (tmp_path / "x.yml").exists()
    env = tmp_path / "bad.env"
    env.write_text("PS_NOT_A_SETTING=1\n")
    assert module.main(["--env-file", str(env), "-o", str(tmp_path / "x.yml")]) == 2
    prefix = "gen_compose: " if module is compose else "gen_stack: "
    assert capsys.readouterr().err.startswith(f"{prefix}{env}: not a setting: PS_NOT_A_SETTING")


@pytest.mark.parametrize("script", ["gen_compose.py", "gen_stack.py"])
def test_entry_scripts_still_run(script: str) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "docker" / script), "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert f"Usage: {script} [OPTIONS]" in done.stdout
    done = subprocess.run([sys.executable, str(ROOT / "docker" / script), "--check"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and "up to date" in done.stdout, done.stderr

