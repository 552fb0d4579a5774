"""What each container of the deployments can read and write, and what it may use.

Reads the committed ``docker-compose.yml`` and ``docker/stack.yml`` (parsed as YAML, so
what is tested is what Docker reads), and the compose file of the gambler experiment
(``docker/experiments/gambler.env``: a proxy before server 0) as the generator writes
it, and checks, for every service:

* keys: a node mounts only its own key bundle, read-only, holding exactly
  ``common.net.keys.needed_keys`` for its identity (``ps-keys --bundles`` writes them: run
  here with the compose file's own arguments); in the swarm stack every service gets
  exactly those files as secrets, so a worker holds its own secret key and no other;
* files: each node writes only its own directory (``<runs>/<service>`` in compose, a
  named volume of its own in the stack), no two services share a writable path, and no
  node can write any key;
* limits: memory (:func:`ps.deploy.resources.memory_limit`, the formula of
  docs/docker.md) and pids limits, a read-only root file system with a tmpfs ``/tmp``,
  rotated json-file logs, bounded restarts;
* the image's entrypoint execs the process (signals reach it directly), keeps no log
  copy of its own and removes a stale ready file;
* ``ps-report`` draws a compose run from its per-service directories.
"""

from __future__ import annotations

import os
import shlex
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from common.net.keys import SECRET_SUFFIX, KeyRing, needed_keys
from ps.deploy import resources
from ps.deploy.compose import deployment_of, render
from ps.keys.cli import main as keys_main

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[3]
ENV_FILE = ROOT / "docker" / "cluster.env"
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
DEFAULT = {"env_file": "docker/cluster.env", "experiment": None, "proxy_shards": [0],
           "byzantine_workers": [], "worker_attack": "gaussian"}
GAMBLER = {**DEFAULT, "experiment": "docker/experiments/gambler.env"}
KINDS = {"shipped": DEFAULT, "gambler": GAMBLER}
RUNS = "${PS_RUNS_DIR:-./runs/compose}"
NODE_ROLES = ("server", "proxy", "worker", "evaluator")


def _compose(kind: str = "shipped") -> dict[str, Any]:
    """The services of the committed compose file, or of the gambler experiment's (as
    the generator writes it at the repository root)."""
    if kind == "shipped":
        text = (ROOT / "docker-compose.yml").read_text()
    else:
        text = render(deployment_of(KINDS[kind]), KINDS[kind])
    return yaml.safe_load(text)["services"]


def _stack() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker" / "stack.yml").read_text())


def _dep(kind: str = "shipped") -> Any:
    return deployment_of(KINDS[kind])


def _topology(kind: str = "shipped") -> tuple[int, int, list[int]]:
    dep = _dep(kind)
    return dep.cfg.num_shards, dep.cfg.num_workers, list(dep.proxied)


def _nodes(services: dict[str, Any]) -> dict[str, Any]:
    return {name: s for name, s in services.items() if resources.role_of(name) in NODE_ROLES}


def _sizes() -> resources.Sizes:
    dep = _dep()
    return resources.sizes_of(dep.cfg, replay_rounds=16)


def _bytes(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = str(text).strip().lower().removesuffix("b")
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def _mount(spec: str) -> tuple[str, str, str]:
    """``source:target[:mode]`` -> (source, target, mode), mode "rw" by default (the
    source may hold a ``${VAR:-default}`` with a colon in it)."""
    parts = spec.split(":")
    mode = parts.pop() if parts[-1] in ("ro", "rw") else "rw"
    target = parts.pop()
    return ":".join(parts), target, mode


# --- compose: keys -------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_compose_nodes_mount_only_their_own_key_bundle_read_only(kind: str) -> None:
    services = _compose(kind)
    nodes = _nodes(services)
    s, n, proxies = _topology(kind)
    assert bool(proxies) == (kind == "gambler")
    assert set(nodes) == {*(f"server-{k}" for k in range(s)), *(f"proxy-{k}" for k in proxies),
                          *(f"worker-{i}" for i in range(n)), "evaluator"}
    for name, service in nodes.items():
        mounts = [_mount(v) for v in service["volumes"]]
        assert (f"{RUNS}/keys/{name}", "/keys", "ro") in mounts, name
        assert [m for m in mounts if "/keys" in m[0]] == [(f"{RUNS}/keys/{name}", "/keys", "ro")]
        assert service["environment"]["PS_KEYS"] == "/keys"


@pytest.mark.parametrize("kind", KINDS)
def test_compose_keys_service_writes_bundles_of_exactly_the_needed_keys(
        kind: str, tmp_path: Path) -> None:
    """The keys service's own command, run here: the full set goes where no container
    mounts it (the keys container's /tmp), and each identity's bundle holds exactly
    ``needed_keys``, with modes KeyRing accepts."""
    keys = _compose(kind)["keys"]
    assert [_mount(v) for v in keys["volumes"]] == [(f"{RUNS}/keys", "/keys", "rw")]
    command = keys["command"]
    command = shlex.split(command) if isinstance(command, str) else list(command)
    assert command[0] == "ps-keys"
    args = command[1:]
    full = Path(args[args.index("--dir") + 1])
    assert full.is_relative_to("/tmp")  # the keys container's tmpfs: no host path
    assert args[args.index("--bundles") + 1] == "/keys"
    args[args.index("--dir") + 1] = str(tmp_path / "all")
    args[args.index("--bundles") + 1] = str(tmp_path / "bundles")
    with pytest.raises(SystemExit) as done:
        keys_main(args)
    assert done.value.code == 0
    s, n, proxies = _topology(kind)
    for name in _nodes(_compose(kind)):
        bundle = tmp_path / "bundles" / name
        wanted = needed_keys(name, s, n, proxies)
        assert sorted(os.listdir(bundle)) == sorted(wanted), name
        assert not stat.S_IMODE(bundle.stat().st_mode) & 0o077
        for file in wanted:
            mode = stat.S_IMODE((bundle / file).stat().st_mode)
            assert not mode & 0o222, (file, oct(mode))  # nobody writes a key
            if file.endswith(SECRET_SUFFIX):
                assert not mode & 0o077, (file, oct(mode))
        KeyRing(bundle).pair(name)  # the process can load its own pair


def test_ps_keys_bundles_remove_stale_keys_and_refuse_without_force(tmp_path: Path) -> None:
    args = ["--dir", str(tmp_path / "all"), "--bundles", str(tmp_path / "b"),
            "--shards", "2", "--workers", "3"]
    with pytest.raises(SystemExit) as done:
        keys_main(args)
    assert done.value.code == 0
    stale = tmp_path / "b" / "server-0" / "worker-7.key"
    stale.write_text("a key of another run")
    with pytest.raises(SystemExit) as done:
        keys_main(args)
    assert done.value.code == 2  # keys exist: --force replaces them
    with pytest.raises(SystemExit) as done:
        keys_main([*args, "--force"])
    assert done.value.code == 0
    assert not stale.exists()  # a server would admit any *.key in its directory
    assert sorted(os.listdir(tmp_path / "b" / "server-0")) == sorted(
        needed_keys("server-0", 2, 3))


# --- compose: files ------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_compose_each_node_writes_only_its_own_directory(kind: str) -> None:
    services = _compose(kind)
    writable: dict[str, list[str]] = {}
    for name, service in _nodes(services).items():
        mounts = [_mount(v) for v in service["volumes"]]
        assert (f"{RUNS}/{name}", "/runs", "rw") in mounts
        writable[name] = [source for source, _, mode in mounts if mode == "rw"]
        assert writable[name] == [f"{RUNS}/{name}"], name
        assert service["environment"]["PS_OUT_DIR"] == "/runs"
        assert service.get("read_only") is True
    # no writable path of one service is, contains or lies in another's path
    everything = {name: [_mount(v)[0] for v in s["volumes"]] for name, s in services.items()}
    for name, paths in writable.items():
        for other, theirs in everything.items():
            if other == name or resources.role_of(other) == "setup":
                continue
            for mine in paths:
                for path in theirs:
                    assert not (path == mine or path.startswith(mine + "/")
                                or mine.startswith(path + "/")), (name, other, path)
    # and no node writes under keys/
    assert not any(p.startswith(f"{RUNS}/keys") for ps in writable.values() for p in ps)


@pytest.mark.parametrize("kind", KINDS)
def test_compose_every_up_is_a_new_run(kind: str) -> None:
    """The runs-dir service creates every service's directory and removes the servers'
    checkpoints before the keys service (and so any node) starts."""
    services = _compose(kind)
    runs_dir = services["runs-dir"]
    assert [_mount(v) for v in runs_dir["volumes"]] == [(RUNS, "/runs", "rw")]
    script = runs_dir["command"][-1]
    assert "rm -f server-*/shard-*.npz" in script
    created = script.split("for d in ", 1)[1].split(";", 1)[0].split()
    assert sorted(created) == sorted(_nodes(services))  # each one's directory and bundle
    assert '[ -d "keys/$$d" ] || mkdir -m 0700 "keys/$$d"' in script  # $$: compose's $
    assert services["keys"]["depends_on"]["runs-dir"]["condition"] == (
        "service_completed_successfully")
    s = _topology()[0]
    for k in range(s):
        assert services[f"server-{k}"]["depends_on"]["keys"]["condition"] == (
            "service_completed_successfully")
        assert services[f"server-{k}"]["environment"]["PS_RESUME"] == "1"
    for name in ("runs-dir", "keys"):
        assert services[name]["network_mode"] == "none"


# --- compose: limits -----------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_compose_limits_logging_and_read_only_root(kind: str) -> None:
    sizes = _sizes()
    for name, service in _compose(kind).items():
        role = resources.role_of(name)
        expected = resources.memory_limit(role, sizes)
        assert _bytes(service["mem_limit"]) == expected, name
        assert _bytes(service["memswap_limit"]) == expected, name  # no swap beyond it
        assert service["pids_limit"] == resources.pids_limit(role), name
        assert service["read_only"] is True, name
        assert any(t.split(":")[0] == "/tmp" for t in service["tmpfs"]), name
        assert service["logging"] == {"driver": "json-file", "options": {
            "max-size": resources.LOG_MAX_SIZE, "max-file": str(resources.LOG_MAX_FILE)}}
        assert service["cap_drop"] == ["ALL"]
        if role in NODE_ROLES:
            assert service["restart"] == "on-failure:3"
    # the formula: more workers or a larger model, more memory; what a server holds
    # grows with n * d / S
    big = resources.Sizes(20, 10_000_000, 2, "fashion-mnist", 784, 16)
    small = resources.Sizes(8, 118_282, 4, "fashion-mnist", 784, 16)
    for role in NODE_ROLES:
        assert resources.memory_limit(role, big) > resources.memory_limit(role, small)
        assert resources.memory_limit(role, small) % resources.ROUND == 0
        assert resources.memory_limit(role, small) >= (
            resources.HEADROOM * resources.memory_estimate(role, small))
    assert (resources.memory_estimate("server", big) - resources.BASE_TORCH
            == 4 * 5_000_000 * (9 * 20 + 12))


def test_memory_limits_cover_the_measured_peaks() -> None:
    """The default run's measured peaks (docs/docker.md, MiB: each process's peak
    resident size, shared library pages included, which is more than its container's
    cgroup was charged in the compose smoke test) stay at least a third below the
    limits."""
    measured = {"server": 358, "proxy": 48, "worker": 560, "evaluator": 557}
    sizes = _sizes()
    for role, peak in measured.items():
        assert peak * 1.33 < resources.mebibytes(resources.memory_limit(role, sizes)), role


# --- compose: fewer server processes than shards ------------------------------------------

def _blocks_compose(tmp_path: Path, processes: int = 2,
                    **env: str) -> tuple[Any, dict[str, Any]]:
    """(deployment, services) of the compose file ``gen_compose.py --server-processes``
    writes from a copy of the env file (with ``env`` on top): the file's own YAML."""
    from ps.deploy.compose import main, set_env_values

    env_file = tmp_path / "cluster.env"
    env_file.write_text(ENV_FILE.read_text())
    set_env_values(env_file, env)
    out = tmp_path / "compose.yml"
    assert main(["--env-file", str(env_file), "--experiment", GAMBLER["experiment"],
                 "-o", str(out), "--server-processes", str(processes)]) == 0
    assert f"PS_SERVER_PROCESSES={processes}\n" in env_file.read_text()
    assert main(["--check", "-o", str(out)]) == 0
    dep = deployment_of({**GAMBLER, "env_file": str(env_file)})
    return dep, yaml.safe_load(out.read_text())["services"]


def test_compose_two_server_processes_keys_and_directories(tmp_path: Path) -> None:
    """S=4, P=2: the nodes are server-0 and server-2 (PS_SHARD 0-1, 2-3) and proxy-0
    (PS_PROXY_SHARD 0-1, PS_PROXY_SHARDS 0); each mounts exactly the bundle needed_keys
    gives its name, which the keys service's own command writes; runs-dir makes a
    directory for each of them and no other."""
    dep, services = _blocks_compose(tmp_path)
    # the file is in tmp_path: its runs directory's default is the repository's, from there
    runs = "${PS_RUNS_DIR:-" + os.path.relpath(ROOT / "runs" / "compose", tmp_path) + "}"
    nodes = _nodes(services)
    assert set(nodes) == {"server-0", "server-2", "proxy-0", "evaluator",
                          *(f"worker-{i}" for i in range(8))}
    env = {name: service["environment"] for name, service in nodes.items()}
    assert (env["server-0"]["PS_SHARD"], env["server-2"]["PS_SHARD"]) == ("0-1", "2-3")
    assert env["proxy-0"]["PS_PROXY_SHARD"] == "0-1"
    assert env["proxy-0"]["PS_PROXY_SHARDS"] == "0"
    assert env["proxy-0"]["PS_PROXY_SERVER"] == "tcp://server-0:5550"
    assert env["worker-5"]["PS_SERVERS"] == "tcp://proxy-0:5550,tcp://server-2:5550"
    assert env["evaluator"]["PS_SERVERS"] == "tcp://server-0:5550,tcp://server-2:5550"
    assert set(services["worker-0"]["depends_on"]) == {"server-0", "server-2", "proxy-0"}
    assert set(services["evaluator"]["depends_on"]) == {"server-0", "server-2"}
    assert set(services["proxy-0"]["depends_on"]) == {"server-0"}
    for name, service in nodes.items():
        assert [_mount(v) for v in service["volumes"]] == [
            (f"{runs}/{name}", "/runs", "rw"), (f"{runs}/keys/{name}", "/keys", "ro")], name
    script = services["runs-dir"]["command"][-1]
    assert sorted(script.split("for d in ", 1)[1].split(";", 1)[0].split()) == sorted(nodes)
    # the keys service's command, run here: a proxy key for the process it fronts
    args = list(services["keys"]["command"][1:])
    assert args[args.index("--proxies") + 1] == "0"
    args[args.index("--dir") + 1] = str(tmp_path / "all")
    args[args.index("--bundles") + 1] = str(tmp_path / "bundles")
    with pytest.raises(SystemExit) as done:
        keys_main(args)
    assert done.value.code == 0
    for name in nodes:
        wanted = needed_keys(name, 4, 8, dep.proxied)
        assert sorted(os.listdir(tmp_path / "bundles" / name)) == sorted(wanted), name
        KeyRing(tmp_path / "bundles" / name).pair(name)
    assert "proxy-0.key" in os.listdir(tmp_path / "bundles" / "server-0")
    assert "proxy-0.key" not in os.listdir(tmp_path / "bundles" / "server-2")


def test_compose_server_process_limits_scale_with_the_shards_it_hosts(tmp_path: Path) -> None:
    """A server process of k shards holds k shards' state, its proxy too: with the cnn
    (d = 1.9 M) the limits of P=2 (two shards each) exceed those of P=4 and are the
    formula's for two shards; workers' and the evaluator's do not change."""
    dep, two = _blocks_compose(tmp_path, 2, PS_MODEL="cnn")
    _, four = _blocks_compose(tmp_path, 4, PS_MODEL="cnn")
    sizes = resources.sizes_of(dep.cfg, replay_rounds=16)
    for name, shards in (("server-0", 2), ("server-2", 2), ("proxy-0", 2)):
        role = resources.role_of(name)
        assert _bytes(two[name]["mem_limit"]) == resources.memory_limit(
            role, sizes, shards=shards), name
        assert _bytes(two[name]["mem_limit"]) > _bytes(four[name]["mem_limit"]), name
        assert _bytes(four[name]["mem_limit"]) == resources.memory_limit(role, sizes), name
    for name in ("worker-0", "evaluator"):
        assert two[name]["mem_limit"] == four[name]["mem_limit"], name
    # the estimate: a process of k shards of d_s is one shard of k * d_s
    for role in ("server", "proxy"):
        base = resources.memory_estimate(role, sizes)
        fixed = resources.BASE_TORCH if role == "server" else resources.BASE_PROXY
        assert resources.memory_estimate(role, sizes, shards=3) - fixed == 3 * (base - fixed)


def test_compose_generator_refuses_more_server_processes_than_shards(tmp_path: Path) -> None:
    from ps.deploy.compose import main

    env_file = tmp_path / "cluster.env"
    env_file.write_text(ENV_FILE.read_text())
    before = env_file.read_text()
    out = tmp_path / "compose.yml"
    for argv in (["--server-processes", "5"], ["--shards", "3"], ["--server-processes", "0"]):
        assert main(["--env-file", str(env_file), "-o", str(out), *argv]) == 2, argv
        assert env_file.read_text() == before, argv  # refused before it changed anything
    assert not out.exists()
    assert main(["--env-file", str(env_file), "-o", str(out), "--shards", "3",
                 "--server-processes", "3"]) == 0
    assert "PS_SHARDS=3\n" in env_file.read_text()


# --- swarm stack -----------------------------------------------------------------------

def test_stack_one_service_per_worker_holding_only_its_own_secret() -> None:
    stack = _stack()
    services = stack["services"]
    n = _topology()[1]
    assert "worker" not in services
    for i in range(n):
        worker = services[f"worker-{i}"]
        assert worker["deploy"]["replicas"] == 1
        assert worker["environment"]["PS_WORKER_ID"] == str(i)
        assert "PS_WORKER_SLOT" not in worker["environment"]
        secrets = [m["source"] for m in worker["secrets"]]
        assert [f for f in secrets if f.endswith(SECRET_SUFFIX)] == [f"worker-{i}.key_secret"]
        assert worker["deploy"]["placement"] == {"preferences": [{"spread": "node.labels.zone"}]}


def test_stack_every_service_gets_exactly_its_needed_keys() -> None:
    stack = _stack()
    s, n, proxies = _topology()
    for name, service in stack["services"].items():
        secrets = service["secrets"]
        assert [m["source"] for m in secrets] == needed_keys(name, s, n, proxies), name
        for m in secrets:
            assert m["target"] == f"/run/secrets/keys/{m['source']}"
            assert m["mode"] == (0o400 if m["source"].endswith(SECRET_SUFFIX) else 0o444)
        assert service["environment"]["PS_KEYS"] == "/run/secrets/keys"
    used = {m["source"] for svc in stack["services"].values() for m in svc["secrets"]}
    assert set(stack["secrets"]) == used


def test_stack_services_share_no_writable_volume() -> None:
    stack = _stack()
    owners: dict[str, str] = {}
    for name, service in stack["services"].items():
        named = [v for v in service["volumes"] if isinstance(v, str)]
        assert named == [f"runs-{name}:/runs"], name
        for volume in named:
            source = volume.split(":")[0]
            assert source not in owners, (name, owners.get(source))
            owners[source] = name
        tmpfs = [v for v in service["volumes"] if isinstance(v, dict)]
        assert tmpfs == [{"type": "tmpfs", "target": "/tmp",
                          "tmpfs": {"size": resources.TMPFS_BYTES}}], name
    assert set(stack["volumes"]) == set(owners)


def test_stack_limits_logging_read_only_and_restarts() -> None:
    stack = _stack()
    assert float(stack["version"]) >= 3.9  # deploy.resources.limits.pids
    sizes = _sizes()
    for name, service in stack["services"].items():
        role = resources.role_of(name)
        limits = service["deploy"]["resources"]["limits"]
        assert _bytes(limits["memory"]) == resources.memory_limit(role, sizes), name
        assert limits["pids"] == resources.pids_limit(role), name
        assert service["read_only"] is True
        assert service["logging"] == {"driver": "json-file", "options": {
            "max-size": resources.LOG_MAX_SIZE, "max-file": str(resources.LOG_MAX_FILE)}}
        assert service["deploy"]["restart_policy"] == {
            "condition": "on-failure", "delay": "5s", "max_attempts": 3}
        assert service["deploy"]["endpoint_mode"] == "dnsrr"
        assert service["cap_drop"] == ["ALL"]


# --- the entrypoint ------------------------------------------------------------------------

def _entrypoint(env: dict[str, str], *command: str, **kwargs: Any) -> Any:
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.Popen(["bash", str(ENTRYPOINT), *command], env={**base, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **kwargs)


def test_entrypoint_execs_the_process_and_keeps_no_log_copy(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    ready.write_text("stale")
    # PS_LOG_NAME: what the generators used to set for the entrypoint's log copy
    env = {"PS_OUT_DIR": str(tmp_path), "PS_READY_FILE": str(ready), "PS_LOG_NAME": "server-0"}
    script = (f'test -e {ready} && echo stale-ready; '
              'trap "echo got-term; exit 7" TERM; echo "$$"; while :; do sleep 0.05; done')
    proc = _entrypoint(env, "sh", "-c", script)
    assert proc.stdout is not None
    # its pid is printed once the trap is set: exec'd, the same process
    assert proc.stdout.readline().strip() == str(proc.pid)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 7 and "got-term" in out
    assert not ready.exists()
    assert sorted(os.listdir(tmp_path)) == []  # no logs/ of its own: docker's logs are the log


def test_entrypoint_refuses_an_unwritable_output_directory(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes any directory")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    proc = _entrypoint({"PS_OUT_DIR": str(locked)}, "ps-server", "--help")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "not writable" in err


def test_entrypoint_leaves_setup_commands_alone(tmp_path: Path) -> None:
    """ps-keys and the runs-dir shell need no output directory (the image's
    PS_OUT_DIR=/runs is not mounted in their containers)."""
    proc = _entrypoint({"PS_OUT_DIR": str(tmp_path / "missing")}, "sh", "-c", "echo ok")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out.strip() == "ok"


# --- ps-report on the compose layout ---------------------------------------------------------

def test_ps_report_reads_a_compose_run(tmp_path: Path) -> None:
    import json

    from ps.plots.run_figures import draw_run

    def write(name: str, rows: list[dict[str, Any]]) -> None:
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows))

    write("evaluator", [{"round": t, "top1": 0.5, "top3": 0.8, "loss": 1.0} for t in (1, 2)])
    for i in range(2):
        write(f"worker-{i}", [{"round": t, "compute_ms": 1.0, "exchange_ms": 2.0}
                              for t in range(3)])
    write("proxy-0", [{"round": t, "corrupted_values": t} for t in range(3)])
    for k in range(2):
        write(f"server-{k}", [{"round": t, "aggregation_ms": 0.5} for t in range(3)])
    (tmp_path / "keys").mkdir()
    written = draw_run(tmp_path)
    assert sorted(p.name for p in written) == [
        "accuracy.png", "aggregation.png", "corruption.png", "round_time.png"]
    done = subprocess.run([sys.executable, "-m", "ps.plots.cli", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
