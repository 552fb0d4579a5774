"""Write ``docker-compose.yml`` for a cluster of n workers and S shards on P server processes.

The run is described by one env file (``docker/cluster.env``: ``PS_*`` lines). The
generator reads it through the settings declarations (``common.conf.settings``): a key
that is no setting, or a value out of range, is refused here, before any container
starts, and the configuration is validated exactly as ``ps-cluster`` validates it.
Each service then gets, as its ``environment:``, precisely the settings its role
takes (derived, like the argv ``ps-cluster`` hands its children): the run
configuration (one YAML anchor), and per role the server, proxy, worker or evaluator
settings, an attacker's attack with its parameters, and the process settings.

One service per server process (``server-<first>``: the S shards spread over
``PS_SERVER_PROCESSES`` contiguous blocks, ``common.net.sharding.server_blocks``, each process
named by its first shard and given its block as ``PS_SHARD``, e.g. ``0-1``), per proxy
(``proxy-<first>``, in front of the server process hosting a shard of ``--proxy-shards``)
and per worker (``worker-<i>``, ``PS_WORKER_ID=i`` fixed in its service), plus the
evaluator and two set-up services that run first, without network: ``runs-dir`` (root,
``CHOWN`` and ``DAC_OVERRIDE`` only) creates one directory per service under the host's
runs directory, hands them to the containers' user and removes the previous run's
checkpoints (every ``up`` is a new run); then ``keys`` writes the run's keys: the full
set in its own tmpfs, and one bundle per identity (``ps-keys --bundles``). A fixed
id per service keeps a run reproducible (worker i always trains on partition i) and
lets one worker be made Byzantine on its own.

What each node's container can touch (the threat: a Byzantine worker holds a valid key,
and any container may be compromised): its own key bundle, read-only at ``/keys``
(exactly ``common.net.keys.needed_keys`` of its identity), and its own directory
``<runs>/<service>`` at ``/runs``, where it writes its metrics and, for a server, its
checkpoint; a read-only root file system with a tmpfs ``/tmp``; memory and pids limits
(``ps/deploy/resources.py``) and rotated logs. No container writes a key a server
reads, nor another node's files.

The file is built as data (:func:`compose_spec`: the ``x-node``, ``x-run`` and
``x-ready`` anchors, the services) and written with PyYAML (``ps.deploy.yamlfile``)
after a header of comments; the generator is a click command (:func:`build_command`).

Every node restarts when it dies (``restart: on-failure``, a few times): a server
resumes from its checkpoint (``PS_RESUME``) and the workers replay what it lost; a
worker rejoins at the servers' round.

Usage (from the repository root)::

    python3 docker/gen_compose.py                        # n, S, P from docker/cluster.env
    python3 docker/gen_compose.py --workers 12 --shards 2  # set them there, then write
    python3 docker/gen_compose.py --server-processes 2   # S shards on 2 server processes
    python3 docker/gen_compose.py --proxy-shards 0,1     # proxies before 2 servers
    python3 docker/gen_compose.py --byzantine-workers 7 --worker-attack gaussian
    python3 docker/gen_compose.py --experiment docker/experiments/gambler.env \
        -o docker/experiments/gambler.compose.yml        # an experiment's overlay on top
    python3 docker/gen_compose.py --check                # exit 1 if the file is stale

An experiment file (``--experiment``, e.g. ``docker/experiments/gambler.env``) holds
``KEY=VALUE`` lines that override the env file's: the shipped files run no attack and
hold no proxy, and an experiment that wants a man-in-the-middle names its
``PS_PROXY_ATTACK`` there. The options given are recorded in the generated file's
header, and ``--check`` regenerates with them to compare. The host paths of a compose
file (its build context, the runs directory's default) are relative to the file's own
directory, so a file written anywhere (``-o``) works from where it is.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click

from common.conf.settings import (
    CLUSTER,
    EVALUATOR,
    LAUNCHERS,
    PROXY,
    ROLES,
    SERVER,
    WORKER,
    check_ranges,
    declared,
    from_environ,
    to_environ,
)
from common.errors import ConfigError
from common.learn.attacks import ATTACKS, NO_ATTACK, attack_names
from common.net.keys import SecurityOptions
from common.net.sharding import ShardSet, format_shard_set
from common.run import plugins
from common.run.cli import LiveChoice
from common.run.commands import DEPLOYED, command_of, setting_classes
from common.run.config import AttackConfig, RunConfig
from common.run.process import ProcessOptions
from ps.deploy import resources
from ps.deploy.yamlfile import MERGE, Anchored, Flow, Literal, Quoted, dump
from ps.launcher.options import ClusterOptions
from ps.proxy.options import ProxyOptions
from server.deadline import AUTO, NONE
from server.options import ServerOptions, check_replayable
from worker.options import ClientOptions, EvalOptions

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ENV = "docker/cluster.env"
DEFAULT_OUTPUT = "docker-compose.yml"
PORT = 5550
READY_FILE = Path("/tmp/ps-ready")
OUT_DIR = Path("/runs")  # in a node's container: its own directory
KEYS_DIR = Path("/keys")  # in a node's container: its own key bundle, read-only
RUNS_DEFAULT = "runs/compose"  # on the host, under the repository root: one directory per service
ALL_KEYS_DIR = "/tmp/keys"  # in the keys container's tmpfs: the full set, never on disk
SETUP_SERVICES = ("runs-dir", "keys")
ARGS_MARK = "# gen_compose.py options: "
SCRIPT = "docker/gen_compose.py"
RESTART_POLICY = "on-failure:3"  # a node that died comes back (not a finished one)
# The topology options of a generated file, as recorded in its header when not given
DEFAULT_OPTIONS: dict[str, Any] = {"env_file": DEFAULT_ENV, "experiment": None,
                                   "proxy_shards": [0], "byzantine_workers": [],
                                   "worker_attack": "gaussian"}


def read_env(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines of an env file (comments and blank lines skipped)."""
    values = {}
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such env file") from None
    for number, line in enumerate(text.splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{path}:{number}: expected KEY=VALUE, got {line!r}")
        values[key.strip()] = value.strip()
    return values


def layers(options: Mapping[str, Any]) -> list[str]:
    """The env files of the recorded ``options``, in the order they apply: the env file,
    then the experiment's overlay if any (paths relative to the repository root)."""
    return [options["env_file"], *([options["experiment"]] if options.get("experiment") else [])]


def options_env(options: Mapping[str, Any]) -> dict[str, str]:
    """The settings of the recorded ``options``: the env file's ``KEY=VALUE`` lines with
    the experiment file's on top; a key that is no setting is refused naming its file."""
    files = {path: read_env(ROOT / path) for path in layers(options)}
    env = {k: v for values in files.values() for k, v in values.items()}
    for path, values in files.items():
        unknown = unknown_settings(values, env)
        if unknown:
            raise ConfigError(f"{path}: not a setting: {', '.join(unknown)} "
                              "(see `ps-cluster --help`)")
    return env


def set_env_values(path: Path, updates: Mapping[str, int | str]) -> None:
    """Rewrite ``KEY=...`` lines of the env file in place (appending missing keys)."""
    text = path.read_text(encoding="utf-8")
    for key, value in updates.items():
        pattern = re.compile(rf"^{re.escape(key)}=.*$", re.MULTILINE)
        if pattern.search(text):
            text = pattern.sub(f"{key}={value}", text)
        else:
            text += f"{key}={value}\n"
    path.write_text(text, encoding="utf-8")


# The one ps-cluster setting an env file may hold: how many server processes host the
# S shards (a topology setting of the deployment, handed to no container as such).
SERVER_PROCESSES = next(d for d in declared(ClusterOptions) if d.name == "server_processes")
# Server processes of a generated deployment without PS_SERVER_PROCESSES (at most S).
DEPLOYED_SERVER_PROCESSES = 4


@dataclass(frozen=True)
class Deployment:
    """A validated run as the compose file deploys it."""

    cfg: RunConfig
    attack: AttackConfig
    env: Mapping[str, str]
    # the shards of each server process, in shard order (``ClusterOptions.blocks``)
    blocks: tuple[ShardSet, ...]

    def settings(self, cls: type, role: str, **fixed: Any) -> Any:
        """An instance of ``cls`` from the env file (the ``role``'s settings), ``fixed`` on top."""
        return from_environ(cls, self.env, {role}, **fixed)

    @property
    def servers(self) -> dict[str, ShardSet]:
        """Server process name (``server-<first>``) -> the shards it hosts, in order."""
        return {f"server-{block[0]}": block for block in self.blocks}

    @property
    def proxied(self) -> tuple[int, ...]:
        """The server processes (by first shard) with a proxy in front: those hosting a
        shard of ``proxy_shards`` (the ``proxies`` of ``common.net.keys.needed_keys``)."""
        targets = set(self.attack.proxy_shards)
        return tuple(block[0] for block in self.blocks if targets & set(block))

    def proxy_targets(self, first: int) -> tuple[int, ...]:
        """The shards of server process ``server-<first>`` that its proxy corrupts."""
        block = self.servers[f"server-{first}"]
        return tuple(s for s in block if s in self.attack.proxy_shards)


def server_blocks_of(env: Mapping[str, str], num_shards: int) -> tuple[ShardSet, ...]:
    """The server processes' shards: ``PS_SERVER_PROCESSES`` contiguous blocks (default
    ``min(S, DEPLOYED_SERVER_PROCESSES)``: a deployment's machines, not the cores of
    the one generating the file)."""
    given = {k: v for k, v in env.items() if k == SERVER_PROCESSES.env}
    options = from_environ(ClusterOptions, given, {CLUSTER})
    check_ranges(options)
    processes = options.server_processes
    if processes is not None and processes > num_shards:
        raise ConfigError(f"{SERVER_PROCESSES.env}={processes} is more than PS_SHARDS="
                          f"{num_shards}: a server process hosts at least one shard")
    return tuple(options.blocks(num_shards, DEPLOYED_SERVER_PROCESSES))


def unknown_settings(keys: Mapping[str, str], env: Mapping[str, str]) -> list[str]:
    """The ``keys`` that are no setting of the commands the containers run (nor
    ``PS_SERVER_PROCESSES``); a plugin ``env`` names by dotted path is loaded first, so
    that its settings are known."""
    plugins.load_plugins(plugins.scan_argv([], env))
    known = {d.env for cls in setting_classes(DEPLOYED) for d in declared(cls)}
    known.add(SERVER_PROCESSES.env)
    return sorted(k for k in keys if k not in known)


def deployment(env: Mapping[str, str], options: Mapping[str, Any]) -> Deployment:
    """Parse and validate the env file's settings and the topology options (a plugin the
    env file names by dotted path is loaded from here first: its settings are known)."""
    unknown = unknown_settings(env, env)
    if unknown:
        raise ConfigError(f"not a setting: {', '.join(unknown)} (see `ps-cluster --help`)")
    cfg = from_environ(RunConfig, env, ROLES).validate()
    # every node restarts on failure and a server resumes from its checkpoint (a process
    # of several shards maybe from the one before)
    several = any(len(b) > 1 for b in server_blocks_of(env, cfg.num_shards))
    d = resources.model_parameters(cfg.model, cfg.dataset)[0]
    check_replayable(from_environ(ServerOptions, env, {SERVER}, shard=0).checkpoint_interval(d),
                     from_environ(ClientOptions, env, {WORKER}).replay_window(d),
                     generations=2 if several else 1)
    scenario = from_environ(AttackConfig, env, LAUNCHERS)
    params = {name: from_environ(a, env, LAUNCHERS) for name, a in ATTACKS.items()}
    byzantine = tuple(options["byzantine_workers"])
    proxies = tuple(options["proxy_shards"])
    if scenario.proxy_attack == NO_ATTACK:
        # a proxy (and its key) only where the env file's experiment asks for one
        proxies = ()
    elif not proxies:  # --proxy-shards '': no proxy, whatever attack the env file names
        scenario = replace(scenario, proxy_attack=NO_ATTACK)
    attack = replace(scenario, params=params, proxy_shards=proxies,
                     byzantine_workers=byzantine,
                     worker_attack=options["worker_attack"] if byzantine else NO_ATTACK)
    attack = attack.validate(cfg)
    server = from_environ(ServerOptions, env, {SERVER}, shard=0)
    if attack.proxy_holds_rounds and server.round_timeout != AUTO and server.deadline():
        raise ConfigError(f"PS_ROUND_TIMEOUT={server.round_timeout}: the proxy attack "
                          f"{attack.proxy_attack} holds each round until all n pushes are in, "
                          "which a round closed without some workers never has")
    return Deployment(cfg, attack, env, server_blocks_of(env, cfg.num_shards))


def deployment_of(options: Mapping[str, Any]) -> Deployment:
    """The deployment a generated file's recorded ``options`` describe (its env file and
    experiment read now)."""
    return deployment(options_env(options), options)


def server_options(dep: Deployment, **fixed: Any) -> ServerOptions:
    """A server's settings from the env file; the default round deadline yields to a
    proxy attack that holds each round until all n pushes are in (as in ps-cluster);
    every server lingers for the one evaluator a deployment starts."""
    options = dep.settings(ServerOptions, SERVER, await_evaluator=True, **fixed)
    if dep.attack.proxy_holds_rounds and options.round_timeout == AUTO:
        return replace(options, round_timeout=NONE)
    return options


def endpoint(host: str) -> str:
    return f"tcp://{host}:{PORT}"


def command_for(options: Mapping[str, Any], script: str = SCRIPT,
                output: str | None = None, default_output: str = DEFAULT_OUTPUT) -> str:
    """The command line of generator ``script`` that reproduces ``options``, writing
    ``output`` (given when not ``default_output``, the generator's default)."""
    parts = [f"python3 {script}"]
    if options["env_file"] != DEFAULT_ENV:
        parts.append(f"--env-file {options['env_file']}")
    if options.get("experiment"):
        parts.append(f"--experiment {options['experiment']}")
    if options["proxy_shards"] != [0]:
        parts.append(f"--proxy-shards '{','.join(map(str, options['proxy_shards']))}'")
    if options["byzantine_workers"]:
        parts.append(f"--byzantine-workers {','.join(map(str, options['byzantine_workers']))}"
                     f" --worker-attack {options['worker_attack']}")
    if output is not None and display_path(output) != display_path(default_output):
        parts.append(f"-o {display_path(output)}")
    return " ".join(parts)


def display_path(path: str | Path) -> str:
    """``path`` (relative to the repository root, or absolute) as a generated file names
    it: relative to the root when inside it, else absolute."""
    full = (ROOT / path).resolve()
    return str(full.relative_to(ROOT)) if full.is_relative_to(ROOT) else str(full)


def root_from(output: str | Path) -> str:
    """The repository root as seen from the directory of the generated file ``output``
    (a relative path: ``.`` for a file at the root); docker-compose reads the paths of a
    file relative to the file's own directory."""
    return os.path.relpath(ROOT, (ROOT / output).resolve().parent)


def runs_host(output: str | Path = DEFAULT_OUTPUT) -> str:
    """The host's runs directory in the compose file ``output``: ``PS_RUNS_DIR``, by
    default ``runs/compose`` of the repository, relative to the file's directory."""
    root = root_from(output)
    return "${PS_RUNS_DIR:-" + ("./" if root == "." else root + "/") + RUNS_DEFAULT + "}"


def sources_text(options: Mapping[str, Any]) -> str:
    """The env file, and the experiment on top: ``a.env + b.env``."""
    return " + ".join(layers(options))


def generated_lines(options: Mapping[str, Any], script: str, docs: str) -> list[str]:
    """The header's first lines: which generator wrote the file from which env files."""
    if not options.get("experiment"):
        return [f"# GENERATED by {script} from {options['env_file']}: edit that file",
                "# (run configuration, attack, timeouts) and rerun the generator; "
                f"see {docs}."]
    return [f"# GENERATED by {script} from {options['env_file']}",
            f"# + {options['experiment']} (an experiment's overlay): edit those files",
            f"# (run configuration, attack, timeouts) and rerun the generator; see {docs}."]


def proxies_text(dep: Deployment) -> str:
    """The header's proxies: ``proxies before shards 0,1``, or ``no proxy``."""
    shards = dep.attack.proxy_shards
    return f"proxies before shards {','.join(map(str, shards))}" if shards else "no proxy"


def _environment(role: str, *settings: Any) -> dict[str, str]:
    """The variables that give a ``role`` process every setting of ``settings`` it takes
    (``TypeError`` for settings its command does not take)."""
    env: dict[str, str] = {}
    for instance in command_of(role).handed(settings):
        env.update(to_environ(instance, role))
    return env


def worker_environment(dep: Deployment, worker_id: int | None, byzantine: bool,
                       keys_dir: Path = KEYS_DIR) -> dict[str, str]:
    """A worker's environment beyond the run configuration; ``worker_id`` None leaves
    ``PS_WORKER_ID`` to the container, ``byzantine`` adds the worker attack's settings."""
    attack = dep.attack
    fronts = [f"proxy-{block[0]}" if block[0] in dep.proxied else f"server-{block[0]}"
              for block in dep.blocks]  # one endpoint per server process, in shard order
    lies = (attack, *attack.active(attack.worker_attack)) if byzantine else ()
    return _environment(
        WORKER, dep.settings(ClientOptions, WORKER, servers=",".join(map(endpoint, fronts)),
                             worker_id=None if worker_id is None else str(worker_id),
                             via_proxy=dep.proxied),
        *lies, SecurityOptions(keys=keys_dir),
        dep.settings(ProcessOptions, WORKER, out_dir=OUT_DIR))


def service_environments(dep: Deployment, keys_dir: Path = KEYS_DIR,
                         ) -> dict[str, tuple[str, dict[str, str]]]:
    """Service name -> (command, environment beyond the run configuration); every
    process reads the run's keys from ``keys_dir``."""
    attack = dep.attack
    n = dep.cfg.num_workers
    servers = dep.servers
    out: dict[str, tuple[str, dict[str, str]]] = {}
    for name, block in servers.items():
        out[name] = ("ps-server", _environment(
            SERVER, server_options(dep, shard=format_shard_set(block),
                                   bind=f"tcp://0.0.0.0:{PORT}",
                                   resume=True),  # a restarted container goes on
            SecurityOptions(keys=keys_dir),
            dep.settings(ProcessOptions, SERVER, out_dir=OUT_DIR, ready_file=READY_FILE)))
    for first in dep.proxied:
        server = f"server-{first}"
        # it corrupts the shards of --proxy-shards its server hosts, passes the others
        scenario = replace(attack, proxy_shards=dep.proxy_targets(first))
        out[f"proxy-{first}"] = ("ps-proxy", _environment(
            PROXY, dep.settings(ProxyOptions, PROXY, bind=f"tcp://0.0.0.0:{PORT}",
                                server=endpoint(server),
                                shard=format_shard_set(servers[server])),
            SecurityOptions(keys=keys_dir),
            scenario, *attack.active(attack.proxy_attack),
            dep.settings(ProcessOptions, PROXY, out_dir=OUT_DIR, ready_file=READY_FILE)))
    for i in range(n):
        out[f"worker-{i}"] = ("ps-worker",
                              worker_environment(dep, i, attack.is_byzantine(i), keys_dir))
    # the evaluator reads the real servers, never a proxy: it measures what they hold
    out["evaluator"] = ("ps-worker", _environment(
        EVALUATOR, dep.settings(ClientOptions, EVALUATOR, evaluate=True,
                                servers=",".join(map(endpoint, servers))),
        dep.settings(EvalOptions, EVALUATOR), SecurityOptions(keys=keys_dir),
        dep.settings(ProcessOptions, EVALUATOR, out_dir=OUT_DIR)))
    return out


def gpu_services(dep: Deployment) -> bool:
    """Whether the workers and the evaluator compute on a GPU (``PS_DEVICE`` cuda or
    cuda:N: their containers ask the runtime for the host's GPUs; ``auto`` asks for
    none, since a request the host cannot meet stops the container)."""
    return dep.settings(ClientOptions, WORKER).device.startswith("cuda")


# The device request of a GPU service: every GPU of the host, through the NVIDIA
# Container Toolkit (each worker takes one of them in turn, ``--device cuda``).
GPU_REQUEST = {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}


def gpu_deploy() -> dict[str, Any]:
    """The compose file's device request (a service's ``deploy:``)."""
    request = {**GPU_REQUEST, "capabilities": Flow(GPU_REQUEST["capabilities"])}
    return {"resources": {"reservations": {"devices": [request]}}}


def deployment_sizes(dep: Deployment) -> resources.Sizes:
    """What the containers' limits depend on (n, d, S, the dataset, the replay window)."""
    d = resources.model_parameters(dep.cfg.model, dep.cfg.dataset)[0]
    return resources.sizes_of(
        dep.cfg, dep.settings(ClientOptions, WORKER).replay_window(d),
        dep.settings(ProcessOptions, SERVER).torch_threads)


def hosted_shards(dep: Deployment, service: str) -> int:
    """The shards whose state the process of ``service`` holds: a server process's
    block, or its proxy's (the process it fronts); 1 for any other service."""
    role, _, first = service.partition("-")
    if role in ("server", "proxy"):
        return len(dep.servers[f"server-{first}"])
    return 1


def service_limits(dep: Deployment, sizes: resources.Sizes) -> dict[str, tuple[int, int]]:
    """Service -> (memory limit in bytes, pids limit), the set-up services included."""
    names = [*SETUP_SERVICES, *service_environments(dep)]
    out = {}
    for name in names:
        role = resources.role_of(name)
        byzantine = role == "worker" and dep.attack.is_byzantine(int(name.split("-")[1]))
        out[name] = (resources.memory_limit(role, sizes, byzantine,
                                            shards=hosted_shards(dep, name)),
                     resources.pids_limit(role, sizes.torch_threads))
    return out


def keys_arguments(dep: Deployment) -> list[str]:
    """The ``ps-keys`` arguments that write every key of the run: a proxy's key for each
    server process with a proxy in front (named by its first shard)."""
    proxies = ",".join(map(str, dep.proxied))
    return ["--shards", str(dep.cfg.num_shards), "--workers", str(dep.cfg.num_workers),
            *(["--proxies", proxies] if proxies else [])]


def topology_text(dep: Deployment) -> str:
    """The header's description of the servers: ``4 servers`` with one shard each, else
    ``8 shards on 2 server processes (0-3, 4-7)``."""
    s, blocks = dep.cfg.num_shards, dep.blocks
    if len(blocks) == s:
        return f"{s} servers"
    return (f"{s} shards on {len(blocks)} server processes "
            f"({', '.join(format_shard_set(b) for b in blocks)})")


def runs_dir_script(dep: Deployment) -> str:
    """The ``runs-dir`` service's shell script: a root-owned host directory (the Docker
    daemon creates a missing one so) goes to the containers' user; each node service's
    directory (0755) and key bundle directory ``keys/<service>`` (0700, under ``keys``,
    0700) is created, and handed over if root's; the servers' checkpoints (and their
    temporary files) of the previous run are removed, so that every ``up`` is a new run
    (a server would otherwise resume, or refuse, another run's checkpoint)."""
    owner = "${PS_UID:-1000}:${PS_GID:-1000}"
    nodes = " ".join(service_environments(dep))
    return "\n".join([
        "set -e",
        f"cd {OUT_DIR}",
        "[ -d keys ] || mkdir -m 0700 keys",
        f"for d in {nodes}; do",
        '  [ -d "$$d" ] || mkdir -m 0755 "$$d"',
        '  [ -d "keys/$$d" ] || mkdir -m 0700 "keys/$$d"',
        "done",
        f"for d in . keys {nodes} keys/*; do",
        '  if [ "$$(stat -c %u "$$d")" = 0 ]; then chown ' + owner + ' "$$d"; fi',
        "done",
        "rm -f server-*/shard-*.npz server-*/shard-*.npz.*.tmp",
    ])


# The image and user of every container, and what each is denied (the ``x-node`` anchor)
IMAGE = "${PS_IMAGE:-byzps:latest}"
USER = "${PS_UID:-1000}:${PS_GID:-1000}"  # non-root; PS_UID/PS_GID: the files are yours


def compose_spec(dep: Deployment, output: str = DEFAULT_OUTPUT) -> dict[str, Any]:
    """The compose file's content as data (``ps.deploy.yamlfile`` types where it is to be
    written as an anchor, an alias, a flow list, a literal block or a quoted string),
    for a file at ``output`` (relative to the repository root: its host paths are
    relative to the file's directory)."""
    runs = runs_host(output)
    limits = service_limits(dep, deployment_sizes(dep))
    node = Anchored("node", {
        "image": IMAGE,
        "user": Quoted(USER),
        "cap_drop": Flow(["ALL"]),
        "security_opt": Flow(["no-new-privileges:true"]),
        # nothing writable but the mounts and /tmp (the ready file, numba's cache)
        "read_only": True,
        "tmpfs": Flow([f"/tmp:size={resources.mebibytes(resources.TMPFS_BYTES)}m"]),
        # the process's output is its log: rotated by Docker (docker compose logs)
        "logging": {"driver": resources.LOG_DRIVER,
                    "options": {k: Quoted(v) for k, v in resources.LOG_OPTIONS.items()}},
        "restart": Quoted("no"),
    })
    run = Anchored("run", {k: Quoted(v) for k, v in to_environ(dep.cfg, SERVER).items()})
    ready = Anchored("ready", {"test": Flow(["CMD", "test", "-f", str(READY_FILE)]),
                               "interval": "2s", "timeout": "2s", "retries": 150})
    services: dict[str, Any] = {
        # It starts first, so it carries the build.
        "runs-dir": {
            MERGE: node,
            "build": {"context": root_from(output),
                      "args": {"TORCH_INDEX_URL": "${TORCH_INDEX_URL:-}"}},
            "user": Quoted("0:0"),
            "cap_add": Flow(["CHOWN", "DAC_OVERRIDE"]),
            "network_mode": "none",
            **_limits(limits["runs-dir"]),
            "volumes": [f"{runs}:{OUT_DIR}"],
            "command": ["sh", "-c", Literal(runs_dir_script(dep) + "\n")],
        },
        "keys": {
            MERGE: node,
            "network_mode": "none",
            **_limits(limits["keys"]),
            "volumes": [f"{runs}/keys:{KEYS_DIR}"],
            "command": Flow(["ps-keys", "--force", "--dir", ALL_KEYS_DIR,
                             "--bundles", str(KEYS_DIR), *keys_arguments(dep)]),
            "depends_on": {"runs-dir": {"condition": "service_completed_successfully"}},
        },
    }
    servers = list(dep.servers)
    proxy_names = [f"proxy-{k}" for k in dep.proxied]
    depends = {"server": ["keys"], "worker": servers + proxy_names, "evaluator": servers}
    shared: dict[tuple[str, ...], Anchored] = {}  # one depends_on block per set: aliases
    for name, (command, env) in service_environments(dep).items():
        kind = name.split("-")[0]
        needs = tuple(depends[kind] if kind != "proxy" else [f"server-{name.split('-')[1]}"])
        if needs not in shared:
            shared[needs] = Anchored(f"{name}-deps", {
                d: {"condition": "service_completed_successfully" if d == "keys"
                    else "service_healthy"} for d in needs})
        service: dict[Any, Any] = {
            MERGE: node,
            "command": Flow([command]),
            "restart": Quoted(RESTART_POLICY),
            **_limits(limits[name]),
            "volumes": [f"{runs}/{name}:{OUT_DIR}", f"{runs}/keys/{name}:{KEYS_DIR}:ro"],
            "environment": {MERGE: run, **{k: Quoted(v) for k, v in env.items()}},
            "depends_on": shared[needs],
        }
        if kind in ("server", "proxy"):
            service["healthcheck"] = ready
        if kind in ("worker", "evaluator") and gpu_services(dep):
            service["deploy"] = gpu_deploy()  # the host's GPUs: NVIDIA Container Toolkit
        services[name] = service
    return {"version": Quoted("2.4"), "x-node": node, "x-run": run, "x-ready": ready,
            "services": services}


def compose_comments(dep: Deployment) -> dict[str, list[str]]:
    """The comments written before the compose file's top-level blocks and set-up
    services (what YAML cannot carry inside them is in docs/docker.md)."""
    return {
        "x-node": ["every container: non-root (PS_UID/PS_GID), no capability, a read-only",
                   "root with a tmpfs /tmp, rotated json-file logs (docs/docker.md)"],
        "x-run": ["the run configuration, identical on every node (the servers compare "
                  "its hash)"],
        "x-ready": ["servers and proxies write PS_READY_FILE once they listen (a proxy: "
                    "once its", "server answered too); no Python, no torch in the check"],
        "services.runs-dir": [
            "one directory per service under the host's runs directory (handed to the",
            "containers' user if root's: the Docker daemon creates a missing one so), and",
            "the previous run's checkpoints removed: every `up` is a new run; it starts",
            "first, so it carries the build"],
        "services.keys": [
            *(["the run's CURVE keys, new for every `up` (a proxy's key only because this",
               "experiment runs a man-in-the-middle test proxy): the full set in this"]
              if dep.proxied else
              ["the run's CURVE keys, new for every `up`: the full set in this"]),
            f"container's tmpfs ({ALL_KEYS_DIR}, gone with it), and keys/<identity>/ holding",
            "exactly what that identity's process loads, for its container alone"],
    }


def render(dep: Deployment, options: Mapping[str, Any], output: str = DEFAULT_OUTPUT) -> str:
    """The compose file of ``dep`` with the given topology options, to be written to
    ``output`` (relative to the repository root: its host paths are relative to it):
    the header, then :func:`compose_spec` written by ``ps.deploy.yamlfile.dump``."""
    byzantine = options["byzantine_workers"]
    header = [
        *generated_lines(options, SCRIPT, "docs/docker.md"),
        f"# Topology: {topology_text(dep)}, {dep.cfg.num_workers} workers, {proxies_text(dep)}"
        + (f", Byzantine workers {','.join(map(str, byzantine))} ({options['worker_attack']})"
           if byzantine else "") + ", one evaluator.",
        "# Regenerate: " + command_for(options, SCRIPT, output),
        ARGS_MARK + json.dumps(options, sort_keys=True),
        "#",
        "# Each node's container mounts its own key bundle read-only at /keys and its own",
        f"# directory {runs_host(output)}/<service> at /runs, nothing else writable;",
        f"# memory limits for d = {deployment_sizes(dep).num_params:,} parameters "
        "(ps/deploy/resources.py).",
        "# File format 2.4: `depends_on` with a `condition:` works with docker-compose v1",
        "# (1.29+) and with `docker compose` v2.",
    ]
    body = dump(compose_spec(dep, output), compose_comments(dep), spaced=("services",))
    return "\n".join(header) + "\n" + body


def _limits(limit: tuple[int, int]) -> dict[str, Any]:
    """A service's memory (no swap beyond it) and pids limits."""
    memory = f"{resources.mebibytes(limit[0])}m"
    return {"mem_limit": memory, "memswap_limit": memory, "pids_limit": limit[1]}


def int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _int_list(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    try:
        return int_list(value)
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected comma-separated integers") from None


def topology_params() -> list[click.Option]:
    """The generators' options for the env files and the topology (recorded in the file)."""
    return [
        click.Option(["--env-file"], default=DEFAULT_ENV, metavar="FILE",
                     help="env file holding the run's settings, relative to the repository "
                     f"root (default {DEFAULT_ENV})"),
        click.Option(["--experiment"], default=None, metavar="FILE",
                     help="an experiment's env file whose KEY=VALUE lines override the env "
                     "file's (e.g. docker/experiments/gambler.env: the gambler proxy), "
                     "relative to the repository root"),
        click.Option(["--proxy-shards"], default="0", callback=_int_list, metavar="IDS",
                     help="shards with a ps-proxy in front when the settings name a "
                     "PS_PROXY_ATTACK (comma-separated, '' for none; default 0); with "
                     "PS_PROXY_ATTACK=none there is no proxy and no proxy key"),
        click.Option(["--byzantine-workers"], default="", callback=_int_list, metavar="IDS",
                     help="worker ids that run --worker-attack (comma-separated)"),
        click.Option(["--worker-attack"], default="gaussian",
                     type=LiveChoice(lambda: attack_names(WORKER)[1:]),
                     help="attack of the Byzantine workers (default gaussian)"),
    ]


def topology_options(args: Any) -> dict[str, Any]:
    """The options of :func:`topology_params` as recorded in a generated file."""
    return {
        "env_file": args.env_file,
        "experiment": args.experiment or None,
        "proxy_shards": sorted(set(args.proxy_shards)),
        "byzantine_workers": sorted(set(args.byzantine_workers)),
        "worker_attack": args.worker_attack,
    }


def recorded_options(path: Path, mark: str) -> dict[str, Any] | None:
    """The options recorded after ``mark`` in a generated file's header (None: no such
    line); an option the file predates has its default."""
    recorded = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith(mark):
            recorded = {**DEFAULT_OPTIONS, **json.loads(line[len(mark):])}
    return recorded


# -h as well as --help; the defaults are in the help texts
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def generator_command(name: str, help_text: str, default_output: str, kind: str,
                      params: list[click.Option], generate: Callable[[Any], int],
                      ) -> click.Command:
    """A generator's click command: the topology options, ``--output``, ``params``,
    ``--check``; ``generate`` gets them as attributes and returns the exit status (a
    ``ConfigError`` is said on stderr as ``<name>: <message>``, exit 2)."""

    def run(**kwargs: Any) -> int:
        try:
            return generate(SimpleNamespace(**kwargs))
        except ConfigError as exc:
            click.echo(f"{name}: {exc}", err=True)
            return 2

    return click.Command(
        name, callback=run, help=help_text, context_settings=CONTEXT_SETTINGS, params=[
            *topology_params(),
            click.Option(["--output", "-o"], default=default_output, metavar="FILE",
                         help=f"{kind} file to write (default {default_output})"),
            *params,
            click.Option(["--check"], is_flag=True,
                         help=f"do not write: exit 1 if the {kind} file differs from what "
                         "its recorded options and the env file give"),
        ])


def run_command(command: click.Command, argv: list[str] | None, script: str) -> int:
    """Run ``command`` (the generator ``script``) on ``argv`` (None: the process's
    arguments): its exit status, 2 for a usage error (said on stderr), 0 after
    ``--help``."""
    try:
        plugins.load_plugins({})  # the installed packages' (the env file's: deployment)
        status = command.main(args=argv, prog_name=Path(script).name, standalone_mode=False)
    except ConfigError as exc:
        click.echo(f"{Path(script).stem}: {exc}", err=True)
        return 2
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort:
        click.echo("Aborted!", err=True)
        return 1
    return status if isinstance(status, int) else 0


def build_command() -> click.Command:
    """``docker/gen_compose.py``."""
    return generator_command("gen_compose", __doc__.split("\n\n")[0], DEFAULT_OUTPUT,
                             "compose", [
        click.Option(["--workers", "-n"], type=int, default=None,
                     help="set PS_WORKERS in the env file first"),
        click.Option(["--shards", "-S"], type=int, default=None,
                     help="set PS_SHARDS in the env file first"),
        click.Option(["--server-processes", "-P"], type=int, default=None,
                     help=f"set {SERVER_PROCESSES.env} in the env file first (the server "
                     "processes the S shards are spread over, 1..S)"),
    ], _generate)


def main(argv: list[str] | None = None) -> int:
    return run_command(build_command(), argv, SCRIPT)


def generator_options(args: Any, mark: str, script: str) -> dict[str, Any] | None:
    """The topology options of a generator run: with ``--check``, those recorded after
    ``mark`` in ``args.output`` (None, said on stderr, if it has none); else the command
    line's."""
    if not args.check:
        return topology_options(args)
    output = ROOT / args.output
    if not output.exists():
        print(f"{args.output} does not exist", file=sys.stderr)
        return None
    recorded = recorded_options(output, mark)
    if recorded is None:
        print(f"{args.output} was not written by {Path(script).name}", file=sys.stderr)
    return recorded


def check_or_write(args: Any, dep: Deployment, options: dict[str, Any],
                   text: str, script: str, default_output: str = DEFAULT_OUTPUT) -> int:
    """Write ``text`` to ``args.output``, or with ``--check`` exit 1 if it holds other text."""
    output = ROOT / args.output
    servers, n = topology_text(dep), dep.cfg.num_workers
    if args.check:
        if output.read_text(encoding="utf-8") != text:
            print(f"{args.output} is stale: it differs from what {sources_text(options)} "
                  f"gives now; rerun: "
                  f"{command_for(options, script, args.output, default_output)}",
                  file=sys.stderr)
            return 1
        print(f"{args.output} is up to date ({servers}, {n} workers)")
        return 0
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}: {servers}, {n} workers, "
          f"proxies before {list(dep.attack.proxy_shards) or 'no shard'}, "
          f"Byzantine workers {options['byzantine_workers'] or 'none'}")
    return 0


def _generate(args: Any) -> int:
    options = generator_options(args, ARGS_MARK, SCRIPT)
    if options is None:
        return 1
    env_path = ROOT / options["env_file"]
    env = options_env(options)
    updates: dict[str, int] = {}
    if not args.check:
        given = {"PS_WORKERS": args.workers, "PS_SHARDS": args.shards,
                 SERVER_PROCESSES.env: args.server_processes}
        updates = {k: v for k, v in given.items() if v is not None}
    for key, value in updates.items():
        if value < 1:
            raise ConfigError(f"{key} must be >= 1, got {value}")
    if options["experiment"]:
        overlaid = sorted(set(updates) & set(read_env(ROOT / options["experiment"])))
        if overlaid:  # the env file's new value would not count
            raise ConfigError(f"{', '.join(overlaid)} is set by the experiment file "
                              f"{options['experiment']}: change it there")
    env = {**env, **{k: str(v) for k, v in updates.items()}}
    dep = deployment(env, options)  # a refused topology leaves the env file as it was
    if updates:
        set_env_values(env_path, updates)
    return check_or_write(args, dep, options, render(dep, options, args.output), SCRIPT)
