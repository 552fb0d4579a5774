"""Check a containerised run's metrics: the end of ``compose_smoke.sh`` and ``swarm_smoke.sh``.

Usage: ``python3 scripts/check_smoke_metrics.py RUNS ENV_FILE [ENV_FILE ...] MIN_TOP1
[--workers N]``. ``RUNS`` holds one directory per service (``<runs>/<service>/<service>.jsonl``:
a bind mount's directories, or links to the stack's volumes); the ``ENV_FILE`` s are the
run's settings in the order the generator layered them, later ones overriding earlier
ones (``docker/cluster.env``, then the experiment's overlay, e.g.
``docker/experiments/gambler.env``). It checks that the evaluator reached the last round with a
top-1 of at least ``MIN_TOP1``, that every shard's server wrote every round with finite
parameters and the shard's final checkpoint (``server-<s>.jsonl`` and ``shard-<s>.npz``
in the directory of the server process hosting shard s: ``server-<first>/``, found
wherever it is, so any ``PS_SERVER_PROCESSES``), that a proxy attack corrupted values, and (with
``--workers N``: one service per worker) that workers 0..N-1 each wrote their metrics.
Prints the top-1 curve and a summary line; exits 1 naming every problem. Standard
library only: it runs on the host, outside the image.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
from typing import Any


def read_env(*paths: str) -> dict[str, str]:
    """``KEY=value`` lines of env files (comments and other lines skipped), a later
    file's value of a key overriding an earlier one's."""
    env = {}
    for path in paths:
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                key, sep, value = line.strip().partition("=")
                if sep and not key.startswith("#"):
                    env[key.strip()] = value.strip()
    return env


def records(runs: str, name: str) -> list[dict[str, Any]]:
    """``<service>.jsonl`` in the service's own directory; exits if it is missing."""
    path = os.path.join(runs, name.removesuffix(".jsonl"), name)
    if not os.path.exists(path):
        sys.exit(f"{name} is missing in {os.path.dirname(path)}")
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def shard_directory(runs: str, shard: int) -> str | None:
    """The directory of the server process that hosts ``shard`` (``server-<first>/``,
    the one holding ``server-<shard>.jsonl``); None if none, or more than one, does."""
    found = glob.glob(os.path.join(runs, "server-*", f"server-{shard}.jsonl"))
    return os.path.dirname(found[0]) if len(found) == 1 else None


def worker_ids(runs: str) -> list[int]:
    """The workers whose metrics are in their own service's directory."""
    paths = glob.glob(os.path.join(runs, "worker-*", "worker-*.jsonl"))
    return sorted(int(os.path.basename(p)[len("worker-"):-len(".jsonl")]) for p in paths
                  if os.path.basename(os.path.dirname(p)) + ".jsonl" == os.path.basename(p))


def check(runs: str, env: dict[str, str], min_top1: float,
          workers: int | None) -> tuple[list[str], list[str]]:
    """(lines to print, problems found)."""
    rounds, shards = int(env["PS_ROUNDS"]), int(env["PS_SHARDS"])
    attack = env.get("PS_PROXY_ATTACK", "none")
    problems = []
    evaluations = records(runs, "evaluator.jsonl")
    final = evaluations[-1] if evaluations else {}
    top1 = final.get("top1", float("nan"))
    if final.get("round") != rounds:
        problems.append(f"the evaluator's last round is {final.get('round')}, expected {rounds}")
    if not (math.isfinite(top1) and top1 >= min_top1):
        problems.append(f"final top-1 {top1} < {min_top1} (chance is 0.1)")
    corrupted = {}
    for path in sorted(glob.glob(os.path.join(runs, "proxy-*", "proxy-*.jsonl"))):
        name = os.path.basename(path)
        corrupted[name] = sum(r.get("corrupted_values", 0) for r in records(runs, name))
    if attack != "none":
        if not corrupted:
            problems.append("no proxy-*.jsonl: did the proxy run?")
        problems += [f"{name}: no value corrupted ({attack})"
                     for name, count in corrupted.items() if count <= 0]
    for s in range(shards):
        directory = shard_directory(runs, s)
        if directory is None:
            problems.append(f"server-{s}.jsonl is missing, or in more than one server-*/")
            continue
        home = os.path.basename(directory)
        with open(os.path.join(directory, f"server-{s}.jsonl"), encoding="utf-8") as lines:
            server = [json.loads(line) for line in lines if line.strip()]
        if len(server) != rounds:
            problems.append(f"{home}/server-{s}.jsonl has {len(server)} rounds, expected {rounds}")
        elif not server[-1].get("params_finite", False):
            problems.append(f"server {s}: parameters not finite after the last round")
        if not os.path.exists(os.path.join(directory, f"shard-{s}.npz")):
            problems.append(f"the final checkpoint {home}/shard-{s}.npz is missing")
    tail = ""
    if workers is not None:
        ids = worker_ids(runs)
        if ids != list(range(workers)):
            problems.append(f"worker metrics for ids {ids}, expected 0..{workers - 1} "
                            f"(one per service)")
        tail = f"; worker ids {ids[0]}..{ids[-1]}" if ids else "; no worker ids"
    n = workers if workers is not None else env.get("PS_WORKERS")
    lines = [
        "top-1 by round: " + " ".join(f"{r['round']}:{r['top1']:.3f}" for r in evaluations),
        f"rule {env.get('PS_RULE')} q={env.get('PS_Q')}, n={n} S={shards}, {rounds} rounds, "
        f"proxy attack {attack} (p={env.get('PS_GAMBLER_P')}): final top-1 {top1:.4f} "
        f"top-3 {final.get('top3', float('nan')):.4f}; corrupted values: "
        + (", ".join(f"{k.removesuffix('.jsonl')} {v}" for k, v in corrupted.items()) or "none")
        + tail,
    ]
    return lines, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs")
    parser.add_argument("env_files", nargs="+", metavar="env_file",
                        help="the run's env files, later ones overriding earlier ones")
    parser.add_argument("min_top1", type=float)
    parser.add_argument("--workers", type=int, default=None,
                        help="one service per worker: check that each wrote its metrics")
    args = parser.parse_args(argv)
    lines, problems = check(args.runs, read_env(*args.env_files), args.min_top1, args.workers)
    print("\n".join(lines))
    if problems:
        print("problems: " + "; ".join(problems))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
