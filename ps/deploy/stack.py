"""Write ``docker/stack.yml``: the cluster as a Docker Swarm stack spread over machines.

The stack is derived from the same declaration as the compose file: ``docker/cluster.env``
read and validated by :func:`ps.deploy.compose.deployment`, each service's environment
from :func:`ps.deploy.compose.service_environments`, each container's limits from
``ps/deploy/resources.py``. What differs is the deployment:

* one service per server process (``server-<first>``, hosting its block of the S shards,
  ``PS_SERVER_PROCESSES`` blocks in all; reachable by that name on the overlay network),
  one per proxy (``proxy-<first>``), one per worker (``worker-<i>``, ``PS_WORKER_ID=i``
  fixed) and the evaluator, each with one replica. One service per worker, not one
  service of n replicas: swarm gives secrets to a service, never to one of its tasks,
  so replicas would all hold every worker's key (a node running one worker could push
  as any); and a fixed id per service keeps a restarted worker on its partition;
* the run's CURVE keys as Docker secrets (created beforehand, ``external``), mounted
  under ``/run/secrets/keys/`` where ``KeyRing`` reads them (``PS_KEYS``); each service
  gets exactly the key files its process loads (``common.net.keys.needed_keys``): a worker
  its own secret key and the servers' public keys; never a key in an environment
  variable or an image;
* each service writes only its own named volume (``runs-<service>``, at ``/runs``; local
  to the node it runs on): no two services share a writable volume; a read-only root
  file system with a tmpfs ``/tmp``; memory and pids limits; rotated json-file logs;
* restart on failure (a few times; a process that finished exits 0 and stays down),
  workers spread over the nodes, service names resolved to the tasks' own addresses
  (dnsrr).

Usage (from the repository root)::

    python3 docker/gen_stack.py                      # n, S, P and the rest from docker/cluster.env
    python3 docker/gen_stack.py --proxy-shards 0,1   # proxies corrupting shards 0 and 1
    python3 docker/gen_stack.py --byzantine-workers 6,7 --worker-attack alie
    python3 docker/gen_stack.py --experiment docker/experiments/gambler.env \
        -o docker/experiments/gambler.stack.yml     # an experiment's overlay on top
    python3 docker/gen_stack.py --check              # exit 1 if docker/stack.yml is stale

See docs/deploy.md for the whole path from machines to results.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from common.conf.settings import SERVER, to_environ
from common.net.keys import PUBLIC_SUFFIX, SECRET_SUFFIX, key_names, needed_keys
from ps.deploy import resources
from ps.deploy.compose import (
    OUT_DIR,
    READY_FILE,
    Deployment,
    check_or_write,
    command_for,
    deployment_of,
    deployment_sizes,
    display_path,
    generated_lines,
    generator_command,
    generator_options,
    gpu_services,
    keys_arguments,
    proxies_text,
    run_command,
    service_environments,
    service_limits,
    topology_text,
)
from ps.deploy.yamlfile import Flow, FlowMap, Octal, Quoted, dump

SCRIPT = "docker/gen_stack.py"
DEFAULT_OUTPUT = "docker/stack.yml"
ARGS_MARK = "# gen_stack.py options: "
KEYS_MARK = "# ps-keys arguments: "
SECRETS_DIR = Path("/run/secrets/keys")
IMAGE = "${PS_IMAGE:-byzps:latest}"
SECRET_NAME = "${PS_SECRET_PREFIX:-byzps}-"
NETWORK = "byzps"
VOLUME_PREFIX = "runs-"  # runs-<service>: each service's own named volume
TMP = "/tmp"
IMAGE_USER = "1000"  # the image's user `ps` (Dockerfile): owner of the secret key files
SPREAD = "node.labels.zone"
# The generic resource a GPU node advertises (its daemon.json's node-generic-resources)
GPU_RESOURCE = "NVIDIA-GPU"
# a service name resolves to its task's own address (as on compose's network), not to a
# virtual IP: no IPVS in the kernel needed, no IPVS idle timeout on the long-lived
# ZeroMQ connections; a restarted task's new address is resolved at the reconnect
ENDPOINT_MODE = "dnsrr"
RESTART_POLICY = {"condition": "on-failure", "delay": "5s", "max_attempts": 3}


def service_keys(dep: Deployment) -> dict[str, list[str]]:
    """Service -> the key files it gets: exactly what its process loads
    (:func:`common.net.keys.needed_keys` of the identity the service is named after): its
    own ``.key_secret``, then the public keys it checks peers against.

    * ``server-<first>``: the public keys of the clients it admits (every worker, the
      evaluator, its proxy if any);
    * ``proxy-<first>``: ``server-<first>``'s public key and the workers' (nothing of
      the server's secret);
    * ``worker-<i>``: the servers' public keys and the proxies' (it expects
      ``proxy-<s>`` at a server process it reaches through its proxy);
    * ``evaluator``: the servers' public keys.
    """
    cfg = dep.cfg
    return {name: needed_keys(name, cfg.num_shards, cfg.num_workers, dep.proxied)
            for name in service_environments(dep)}


def _secret_mount(name: str) -> dict[str, Any]:
    secret = name.endswith(SECRET_SUFFIX)
    return FlowMap({"source": name, "target": str(SECRETS_DIR / name), "uid": IMAGE_USER,
            "gid": IMAGE_USER, "mode": Octal(0o400 if secret else 0o444)})


def stack_spec(dep: Deployment) -> dict[str, Any]:
    """The stack file's content (services, network, volumes, secrets) as plain data."""
    run = to_environ(dep.cfg, SERVER)
    environments = service_environments(dep, keys_dir=SECRETS_DIR)
    limits = service_limits(dep, deployment_sizes(dep))
    keys = service_keys(dep)
    spec: dict[str, Any] = {}
    for name, (command, env) in environments.items():
        memory, pids = limits[name]
        deploy: dict[str, Any] = {
            "replicas": 1, "endpoint_mode": ENDPOINT_MODE,
            "restart_policy": dict(RESTART_POLICY),
            "resources": {"limits": {"memory": f"{resources.mebibytes(memory)}M",
                                     "pids": pids}}}
        if name.startswith("worker-"):
            deploy["placement"] = {"preferences": [{"spread": SPREAD}]}
        if name.startswith(("worker-", "evaluator")) and gpu_services(dep):
            # swarm places by generic resources: each GPU node's daemon advertises its
            # GPUs (node-generic-resources, docs/deploy.md)
            deploy["resources"]["reservations"] = {"generic_resources": [
                {"discrete_resource_spec": {"kind": GPU_RESOURCE, "value": 1}}]}
        service: dict[str, Any] = {
            "image": IMAGE, "command": Flow([command]),
            "environment": {k: Quoted(v) for k, v in {**run, **env}.items()},
            "secrets": [_secret_mount(key) for key in keys[name]],
            "volumes": [f"{VOLUME_PREFIX}{name}:{OUT_DIR}",
                        FlowMap({"type": "tmpfs", "target": TMP,
                                 "tmpfs": {"size": resources.TMPFS_BYTES}})],
            "networks": Flow([NETWORK]), "cap_drop": Flow(["ALL"]), "read_only": True,
            "logging": {"driver": resources.LOG_DRIVER, "options": dict(resources.LOG_OPTIONS)},
            "deploy": deploy}
        if name.startswith(("server-", "proxy-")):
            service["healthcheck"] = {"test": Flow(["CMD", "test", "-f", str(READY_FILE)]),
                                      "interval": "2s", "timeout": "2s", "retries": 150}
        spec[name] = service
    names = [f"{identity}{suffix}" for identity in key_names(
        dep.cfg.num_shards, dep.cfg.num_workers, dep.proxied)
        for suffix in (PUBLIC_SUFFIX, SECRET_SUFFIX)]
    used = {key for files in keys.values() for key in files}
    return {
        "version": Quoted("3.9"),  # deploy.resources.limits.pids
        "services": spec,
        "networks": {NETWORK: {"driver": "overlay", "attachable": True}},
        "volumes": {f"{VOLUME_PREFIX}{name}": {} for name in spec},
        # the name double-quoted: scripts/swarm_secrets.sh reads it so
        "secrets": {key: {"external": True, "name": Quoted(SECRET_NAME + key)}
                    for key in names if key in used},
    }


def render(dep: Deployment, options: dict[str, Any], output: str = DEFAULT_OUTPUT) -> str:
    """The stack file of ``dep`` with the given topology options, to be written to
    ``output`` (named in its regenerate command when not the default)."""
    cfg = dep.cfg
    byzantine = options["byzantine_workers"]
    header = [
        *generated_lines(options, SCRIPT, "docs/deploy.md"),
        f"# Docker Swarm stack: {topology_text(dep)}, {proxies_text(dep)}, "
        f"{cfg.num_workers} worker services (worker-<i>: one replica, its own key)"
        + (f", Byzantine workers {','.join(map(str, byzantine))} ({options['worker_attack']})"
           if byzantine else "") + ", one evaluator.",
        "# Regenerate: " + command_for(options, SCRIPT, output, DEFAULT_OUTPUT),
        ARGS_MARK + json.dumps(options, sort_keys=True),
        KEYS_MARK + " ".join(keys_arguments(dep)),
        "#",
        "# Deploy from a manager node (docs/deploy.md):",
        "#   " + ("" if display_path(output) == DEFAULT_OUTPUT
                 else f"PS_STACK_FILE={display_path(output)} ")
        + "bash scripts/swarm_secrets.sh create     # the run's keys as Docker secrets",
        f"#   docker stack deploy -c {display_path(output)} byzps",
        "# Read at deploy: PS_IMAGE (default byzps:latest; on several machines an image",
        "# in a registry every node pulls from), PS_SECRET_PREFIX (default byzps: the",
        "# secrets are named <prefix>-<key file>).",
        "# Each service holds exactly the keys its process loads, writes only its own",
        "# volume runs-<service>; memory limits for d = "
        f"{deployment_sizes(dep).num_params:,} parameters (ps/deploy/resources.py).",
    ]
    return "\n".join(header) + "\n" + dump(stack_spec(dep), spaced=("services",))


def _generate(args: Any) -> int:
    options = generator_options(args, ARGS_MARK, SCRIPT)
    if options is None:
        return 1
    dep = deployment_of(options)
    return check_or_write(args, dep, options, render(dep, options, args.output), SCRIPT,
                          DEFAULT_OUTPUT)


def build_command() -> click.Command:
    """``docker/gen_stack.py``."""
    return generator_command("gen_stack", __doc__.split("\n\n")[0], DEFAULT_OUTPUT,
                             "stack", [], _generate)


def main(argv: list[str] | None = None) -> int:
    return run_command(build_command(), argv, SCRIPT)
