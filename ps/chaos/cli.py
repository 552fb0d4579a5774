"""The chaos package's two commands, as ``scripts/chaos.py`` and
``scripts/chaos_faults.py`` run them: :func:`chaos` (the keyed cluster attacked by the
holders of its Byzantine workers' keys, the run the package's docstring explains: its
settings, the attacked cluster of ``ps.chaos.cluster``, the CPU of ``ps.chaos.cpu``, the
JSON summary; exit 1 unless nothing crashed and the replay is bit-identical) and
:func:`faults` (``ps.chaos.faults``: SIGKILLs on a schedule during a supervised run; exit
1 unless it finished bit-identical). Neither has a docstring, so that ``--help`` shows
their options alone, as the scripts always did.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import time
from pathlib import Path

import click

from common.net.keys import KeyRing, SecurityOptions, create_keys
from common.run.config import AttackConfig, RunConfig
from ps.chaos.classes import BYZANTINE_KEYS, Attackers
from ps.chaos.cluster import attack_cluster
from ps.chaos.cpu import cpu_summary, worst_headers
from ps.chaos.faults import run_with_faults
from ps.launcher.cluster import ClusterSpec
from ps.launcher.options import ClusterOptions
from server.options import ServerOptions
from worker.options import ClientOptions


@click.command(context_settings={"show_default": True})
@click.option("--frames", "quota", default=100_000, type=int,
              help="Hostile frames of every flood class at each target.")
@click.option("--workers", default=10, type=int, help="n: the run's workers.")
@click.option("--honest", default=6, type=int,
              help="Workers 0..h-1 run; the keys of the others are the attackers' (at least "
              f"{BYZANTINE_KEYS} of them); q = n - h and the quorum is h.")
@click.option("--shards", default=4, type=int)
@click.option("--rounds", default=None, type=int,
              help="Honest rounds; enough that the run outlasts the attack, at a round per "
              "--round-timeout while it lasts (the attack stops 20 rounds before the end). "
              "Default: max(1000, FRAMES / 12).")
@click.option("--rule", default="marmed")
@click.option("--proxy-attack", default="gambler",
              help="The proxy in front of shard 0 (one that holds whole rounds cannot run "
              "with a round deadline).")
@click.option("--round-timeout", default=0.3, type=float,
              help="Seconds a round waits for a worker that is not absent (a Byzantine key "
              "that says HELLO or pushes is present again).")
@click.option("--idle-connections", default=1100, type=int,
              help="Idle TCP connections opened to each target during the floods.")
@click.option("--strangers", default=200, type=int,
              help="Connection attempts with no key or an unknown key.")
@click.option("--giant-seconds", default=20.0, type=float,
              help="Seconds each 2 GB class, and each key holders' phase (unread replies, "
              "bare connections, a proxy key's envelopes), runs alone before the floods.")
@click.option("--bare-connections", default=10_000, type=int,
              help="Connections that never start a handshake kept open at server-1 (the "
              "bare phase), opened again as it cuts them.")
@click.option("--window-wait", default=0.05, type=float,
              help="Seconds a windowed class waits for replies before it goes on.")
@click.option("--cpu-messages", default=3000, type=int,
              help="Messages of each candidate header in the CPU measurement (0: skip it).")
@click.option("--before-tree", default=None, type=click.Path(path_type=Path, file_okay=False,
                                                              exists=True),
              help="A checkout of the code before the insider changes (git worktree add "
              "--detach DIR c9cfc53): measure its server's CPU on the same headers.")
@click.option("--run-timeout", default=4 * 3600.0, type=float,
              help="Stop the cluster (a failure) after this many seconds.")
@click.option("--keep", default=None, type=click.Path(path_type=Path, file_okay=False),
              help="Copy the run's logs and metrics here (default: they go with the temporary "
              "directory).")
@click.option("--json", "json_path", default=None, type=click.Path(path_type=Path))
def chaos(quota: int, workers: int, honest: int, shards: int, rounds: int | None, rule: str,
          proxy_attack: str, round_timeout: float, idle_connections: int, strangers: int,
          giant_seconds: float, bare_connections: int, window_wait: float, cpu_messages: int,
          before_tree: Path | None, run_timeout: float, keep: Path | None,
          json_path: Path | None) -> None:
    if workers - honest < BYZANTINE_KEYS or honest < 1:
        raise click.BadParameter(f"needs 1 <= --honest <= n - {BYZANTINE_KEYS} (the "
                                 "attackers hold the keys of workers h..h+3)")
    rounds = rounds or max(1000, quota // 12)
    settings = {"dataset": "synthetic", "num_workers": workers, "num_shards": shards,
                "rule": rule, "q": workers - honest, "rounds": rounds, "seed": 7}
    cfg = RunConfig.from_settings(**settings).validate()
    attack = AttackConfig.build(proxy_attack=proxy_attack, proxy_shards=(0,)).validate(cfg)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        keys = out / "keys"
        create_keys(keys, shards, workers, proxies=(0,))
        spec = ClusterSpec(cfg=cfg, attack=attack, out_dir=out / "run",
                           cluster=ClusterOptions(no_evaluator=False, max_restarts=0,
                                                  run_timeout_s=run_timeout,
                                                  server_processes=shards),  # server-1
                           server=ServerOptions(round_timeout=str(round_timeout), quorum=honest),
                           security=SecurityOptions(keys=keys))
        options = {"idle": idle_connections, "strangers": strangers,
                   "giant_seconds": giant_seconds, "bare": bare_connections,
                   "window_wait_s": window_wait,
                   "pace_s": round_timeout}
        report = attack_cluster(spec, KeyRing(keys), quota, honest, options)
        if keep is not None:
            shutil.copytree(spec.out_dir, keep, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("keys", "*.npz"))
        if cpu_messages > 0:
            trees = {"after": Path(__file__).resolve().parents[2]}
            if before_tree is not None:
                trees["before"] = before_tree.resolve()
            cpu = {label: worst_headers(tree, keys, settings, cpu_messages, out / f"cpu-{label}",
                                        Attackers.after(honest).flood)
                   for label, tree in trees.items()}
            report["summary"]["cpu_ms_per_1000_worst_accepted"] = cpu_summary(cpu)
            report["cpu"] = cpu
    report["summary"]["wall_seconds"] = round(time.monotonic() - started, 1)
    click.echo(json.dumps(report["summary"], indent=2))
    if json_path:
        json_path.write_text(json.dumps(report, indent=2) + "\n")
    ok = report["summary"]["crashes"] == 0 and report["summary"]["bit_identical"]
    raise SystemExit(0 if ok else 1)


@click.command(context_settings={"show_default": True})
@click.option("--workers", default=8, type=int)
@click.option("--shards", default=4, type=int)
@click.option("--rounds", default=300, type=int)
@click.option("--rule", default="marmed")
@click.option("--q", default=2, type=int)
@click.option("--round-timeout", default=0.5, type=float)
@click.option("--quorum", default=6, type=int)
@click.option("--seed", default=11, type=int, help="Run seed; also picks the victims.")
@click.option("--json", "json_path", default=None, type=click.Path(path_type=Path))
def faults(workers: int, shards: int, rounds: int, rule: str, q: int, round_timeout: float,
           quorum: int, seed: int, json_path: Path | None) -> None:
    cfg = RunConfig(dataset="synthetic", num_workers=workers, num_shards=shards, rule=rule,
                    q=q, rounds=rounds, seed=seed).validate()
    attack = AttackConfig.build(proxy_attack="gambler", proxy_shards=(0,)).validate(cfg)
    pick = random.Random(seed)
    victim_shard = pick.randrange(1, shards)
    schedule = [(rounds // 4, f"worker-{pick.randrange(workers)}"),
                (rounds // 2, "proxy-0"),
                (3 * rounds // 4, f"server-{victim_shard}")]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        spec = ClusterSpec(
            cfg=cfg, attack=attack, out_dir=out,
            client=ClientOptions(timeout_s=5.0),
            cluster=ClusterOptions(max_restarts=3, server_processes=shards,
                                   worker_processes=workers),  # a process each
            server=ServerOptions(round_timeout=str(round_timeout), quorum=quorum,
                                 checkpoint_every=10),
            security=SecurityOptions())
        report = run_with_faults(spec, schedule)
    click.echo(json.dumps(report, indent=2))
    if json_path:
        json_path.write_text(json.dumps(report, indent=2) + "\n")
    raise SystemExit(0 if report["run_finished"] and report["bit_identical"] else 1)
