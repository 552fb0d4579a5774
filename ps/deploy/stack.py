"""Write ``docker/stack.yml``: the cluster as a Docker Swarm stack spread over machines.

The stack is derived from the same declaration as the compose file: ``docker/cluster.env``
read and validated by :func:`ps.deploy.compose.deployment`, each service's environment
from :func:`ps.deploy.compose.service_environments`. What differs is the deployment:

* one service per server (``server-<s>``, reachable by that name on the overlay network),
  one per proxy (``proxy-<s>``) and the evaluator, each with one replica;
* ONE ``worker`` service of n replicas: a replica's worker id is its task slot - 1
  (``PS_WORKER_SLOT={{.Task.Slot}}``, turned into ``PS_WORKER_ID`` by the image's
  entrypoint, which also drops ``PS_WORKER_ATTACK`` on the replicas whose id is not in
  ``PS_BYZANTINE_WORKERS``), so a restarted task keeps its id and its data partition;
* the run's CURVE keys as Docker secrets (created beforehand, ``external``), mounted
  under ``/run/secrets/keys/`` where ``KeyRing`` reads them (``PS_KEYS``); each service
  gets only the key files it loads (see :func:`service_keys`), never a key in an
  environment variable or an image;
* restart on failure (a few times; a process that finished exits 0 and stays down),
  workers spread over the nodes, metrics and checkpoints on the named volume ``runs``
  (local to each node), service names resolved to the tasks' own addresses (dnsrr).

Usage (from the repository root)::

    python3 docker/gen_stack.py                      # n, S and the rest from docker/cluster.env
    python3 docker/gen_stack.py --proxy-shards 0,1   # proxies before servers 0 and 1
    python3 docker/gen_stack.py --byzantine-workers 6,7 --worker-attack alie
    python3 docker/gen_stack.py --check              # exit 1 if docker/stack.yml is stale

See docs/deploy.md for the whole path from machines to results.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from common.errors import ConfigError
from common.keys import PUBLIC_SUFFIX, SECRET_SUFFIX, key_names
from common.settings import SERVER, to_environ
from ps.deploy.compose import (
    OUT_DIR,
    READY_FILE,
    ROOT,
    Deployment,
    add_topology_arguments,
    check_or_write,
    command_for,
    deployment,
    generator_options,
    read_env,
    service_environments,
    worker_environment,
)

SCRIPT = "docker/gen_stack.py"
DEFAULT_OUTPUT = "docker/stack.yml"
ARGS_MARK = "# gen_stack.py options: "
KEYS_MARK = "# ps-keys arguments: "
SECRETS_DIR = Path("/run/secrets/keys")
IMAGE = "${PS_IMAGE:-byzps:latest}"
SECRET_NAME = "${PS_SECRET_PREFIX:-byzps}-"
NETWORK = "byzps"
VOLUME = "runs"
WORKER = "worker"
TASK_SLOT = "{{.Task.Slot}}"
IMAGE_USER = "1000"  # the image's user `ps` (Dockerfile): owner of the secret key files
SPREAD = "node.labels.zone"
# a service name resolves to its task's own address (as on compose's network), not to a
# virtual IP: no IPVS in the kernel needed, no IPVS idle timeout on the long-lived
# ZeroMQ connections; a restarted task's new address is resolved at the reconnect
ENDPOINT_MODE = "dnsrr"
RESTART_POLICY = {"condition": "on-failure", "delay": "5s", "max_attempts": 3}


class Octal(int):
    """An int written in octal in the YAML (a file mode)."""


def service_keys(dep: Deployment) -> dict[str, list[str]]:
    """Service -> the key files it gets: the secret files of the identities it speaks as,
    then the public keys it checks peers against. Exactly what its ``KeyRing`` loads:

    * ``server-<s>``: its ``.key_secret`` and the public keys of the clients it admits
      (every worker, the evaluator, its proxy if any);
    * ``proxy-<s>``: its own ``.key_secret`` (towards server s), ``server-<s>.key_secret``
      (it impersonates server s to the workers) and ``server-<s>.key``, and the workers'
      public keys (the clients it admits);
    * ``worker``: every worker's ``.key_secret`` (a replica's id is its task slot: swarm
      gives secrets per service, not per task) and the servers' public keys;
    * ``evaluator``: its ``.key_secret`` and the servers' public keys.
    """
    cfg, attack = dep.cfg, dep.attack
    workers = [f"worker-{i}{PUBLIC_SUFFIX}" for i in range(cfg.num_workers)]
    servers = [f"server-{k}{PUBLIC_SUFFIX}" for k in range(cfg.num_shards)]
    out: dict[str, list[str]] = {}
    for k in range(cfg.num_shards):
        proxy = [f"proxy-{k}{PUBLIC_SUFFIX}"] if k in attack.proxy_shards else []
        out[f"server-{k}"] = [f"server-{k}{SECRET_SUFFIX}", *workers,
                              f"evaluator{PUBLIC_SUFFIX}", *proxy]
    for k in attack.proxy_shards:
        out[f"proxy-{k}"] = [f"proxy-{k}{SECRET_SUFFIX}", f"server-{k}{SECRET_SUFFIX}",
                             f"server-{k}{PUBLIC_SUFFIX}", *workers]
    out[WORKER] = [*(f"worker-{i}{SECRET_SUFFIX}" for i in range(cfg.num_workers)), *servers]
    out["evaluator"] = [f"evaluator{SECRET_SUFFIX}", *servers]
    return out


def keys_arguments(dep: Deployment) -> str:
    """The ``ps-keys`` arguments that write every key file the stack's secrets hold."""
    proxies = ",".join(map(str, dep.attack.proxy_shards))
    return (f"--shards {dep.cfg.num_shards} --workers {dep.cfg.num_workers}"
            + (f" --proxies {proxies}" if proxies else ""))


def _secret_mount(name: str) -> dict[str, Any]:
    secret = name.endswith(SECRET_SUFFIX)
    return {"source": name, "target": str(SECRETS_DIR / name), "uid": IMAGE_USER,
            "gid": IMAGE_USER, "mode": Octal(0o400 if secret else 0o444)}


def stack_spec(dep: Deployment) -> dict[str, Any]:
    """The stack file's content (services, network, volume, secrets) as plain data."""
    run = to_environ(dep.cfg, SERVER)
    environments = service_environments(dep, keys_dir=SECRETS_DIR)
    # one service for all workers instead of worker-<i>: the id comes from the task slot
    # (docker/entrypoint.sh), the attack's settings are there for the Byzantine ids
    processes = {name: entry for name, entry in environments.items()
                 if not name.startswith("worker-")}
    evaluator = processes.pop("evaluator")
    processes[WORKER] = ("ps-worker", {"PS_WORKER_SLOT": TASK_SLOT, **worker_environment(
        dep, None, bool(dep.attack.byzantine_workers), keys_dir=SECRETS_DIR)})
    processes["evaluator"] = evaluator
    keys = service_keys(dep)
    spec: dict[str, Any] = {}
    for name, (command, env) in processes.items():
        deploy: dict[str, Any] = {
            "replicas": dep.cfg.num_workers if name == WORKER else 1,
            "endpoint_mode": ENDPOINT_MODE, "restart_policy": dict(RESTART_POLICY)}
        if name == WORKER:
            deploy["placement"] = {"preferences": [{"spread": SPREAD}]}
        service: dict[str, Any] = {
            "image": IMAGE, "command": [command],
            "environment": {**run, "PS_LOG_NAME": name, **env},
            "secrets": [_secret_mount(key) for key in keys[name]],
            "volumes": [f"{VOLUME}:{OUT_DIR}"], "networks": [NETWORK],
            "cap_drop": ["ALL"], "deploy": deploy}
        if name.startswith(("server-", "proxy-")):
            service["healthcheck"] = {"test": ["CMD", "test", "-f", str(READY_FILE)],
                                      "interval": "2s", "timeout": "2s", "retries": 150}
        spec[name] = service
    names = [f"{identity}{suffix}" for identity in key_names(
        dep.cfg.num_shards, dep.cfg.num_workers, dep.attack.proxy_shards)
        for suffix in (PUBLIC_SUFFIX, SECRET_SUFFIX)]
    used = {key for files in keys.values() for key in files}
    return {
        "version": "3.8",
        "services": spec,
        "networks": {NETWORK: {"driver": "overlay", "attachable": True}},
        "volumes": {VOLUME: {}},
        "secrets": {key: {"external": True, "name": SECRET_NAME + key}
                    for key in names if key in used},
    }


_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Octal):
        return f"0{int(value):o}"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a YAML double-quoted scalar
    if isinstance(value, list) and not any(isinstance(v, dict | list) for v in value):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    if isinstance(value, dict) and not any(isinstance(v, dict | list) for v in value.values()):
        for key in value:
            _plain_key(key)
        return "{" + ", ".join(f"{k}: {_scalar(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no YAML scalar for {value!r}")


def _plain_key(key: str) -> str:
    if not _KEY.match(key):
        raise ValueError(f"not a plain YAML key: {key!r}")
    return key


def to_yaml(value: dict[str, Any], depth: int = 0) -> list[str]:
    """YAML lines of nested dicts: block style, except lists (one line each, or one line
    per entry for a list of dicts); a blank line before each entry of the first two
    levels that holds a dict or a list (the sections and the services)."""
    pad = "  " * depth
    lines: list[str] = []
    for key, item in value.items():
        _plain_key(key)
        if not isinstance(item, dict) or not item:
            lines.append(f"{pad}{key}: {_scalar(item)}")
            continue
        if depth <= 1 and lines and any(isinstance(v, dict | list) for v in item.values()):
            lines.append("")
        lines.append(f"{pad}{key}:")
        for sub, entry in item.items():
            if isinstance(entry, list) and any(isinstance(v, dict) for v in entry):
                lines.append(f"{pad}  {_plain_key(sub)}:")
                lines += [f"{pad}    - {_scalar(e)}" for e in entry]
            else:
                lines += to_yaml({sub: entry}, depth + 1)
    return lines


def render(dep: Deployment, options: dict[str, Any]) -> str:
    """The stack file of ``dep`` with the given topology options."""
    cfg, attack = dep.cfg, dep.attack
    byzantine = options["byzantine_workers"]
    header = [
        f"# GENERATED by {SCRIPT} from {options['env_file']}: edit that file (run",
        "# configuration, attack, timeouts) and rerun the generator; see docs/deploy.md.",
        f"# Docker Swarm stack: {cfg.num_shards} servers, proxies before shards "
        f"{','.join(map(str, attack.proxy_shards)) or '(none)'}, one worker service of "
        f"{cfg.num_workers} replicas (worker id = task slot - 1)"
        + (f", Byzantine workers {','.join(map(str, byzantine))} ({options['worker_attack']})"
           if byzantine else "") + ", one evaluator.",
        "# Regenerate: " + command_for(options, SCRIPT),
        ARGS_MARK + json.dumps(options, sort_keys=True),
        KEYS_MARK + keys_arguments(dep),
        "#",
        "# Deploy from a manager node (docs/deploy.md):",
        "#   bash scripts/swarm_secrets.sh create     # the run's keys as Docker secrets",
        "#   docker stack deploy -c docker/stack.yml byzps",
        "# Read at deploy: PS_IMAGE (default byzps:latest; on several machines an image",
        "# in a registry every node pulls from), PS_SECRET_PREFIX (default byzps: the",
        "# secrets are named <prefix>-<key file>).",
    ]
    return "\n".join([*header, *to_yaml(stack_spec(dep))]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_topology_arguments(parser)
    parser.add_argument("--output", "-o", default=DEFAULT_OUTPUT,
                        help=f"stack file to write (default {DEFAULT_OUTPUT})")
    parser.add_argument("--check", action="store_true",
                        help="do not write: exit 1 if the stack file differs from what its "
                        "recorded options and the env file give")
    args = parser.parse_args(argv)
    try:
        options = generator_options(args, ARGS_MARK, SCRIPT)
        if options is None:
            return 1
        dep = deployment(read_env(ROOT / options["env_file"]), options)
        return check_or_write(args, dep, options, render(dep, options), SCRIPT)
    except ConfigError as exc:
        print(f"gen_stack: {exc}", file=sys.stderr)
        return 2
