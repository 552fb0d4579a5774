"""The attacked cluster: the launcher's cluster with only the honest workers 0..h-1
started (``Cluster(spec, workers=...)``: the others' keys are the attackers'), run in the
background while the phases attack server-1 and proxy-0 (the 2 GB offenders alone, the key
holders' phases, then the floods beside the oversize offenders, the idle connections and
the strangers, the straggler pacing the rounds throughout); afterwards the crashes, the
reference engine's replay of the recorded participation, and the run's JSON summary.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import click

from common.net.keys import KeyRing
from common.run.metrics import read_jsonl
from common.run.process import pin_torch_threads
from ps.chaos.attack import Attack
from ps.chaos.classes import (
    Attackers,
    Target,
    giant_message,
    hello_message,
    oversize_message,
)
from ps.chaos.floods import Offender, Straggler
from ps.chaos.keyholders import keyholder_phases
from ps.chaos.measure import (
    Sampler,
    barred_in_log,
    holds_in_log,
    last_round,
    log_bytes,
    print_table,
    shard_sizes,
)
from ps.launcher.cluster import BackgroundRun, Cluster, ClusterSpec
from ps.launcher.report import ClusterResult
from ps.reference.engine import simulate
from ps.reference.participation import read_participation


def attack_cluster(spec: ClusterSpec, ring: KeyRing, quota: int, honest: int,
                   options: dict) -> dict:
    """Run the cluster of ``spec`` with only its ``honest`` workers, attack it through
    every phase, and report: ``{"summary": ..., "classes": [...]}``."""
    cfg = spec.cfg
    attackers = Attackers.after(honest)
    # no worker may be lost: the quorum is all h of them, so the supervisor has no spare
    cluster = Cluster(spec, workers=range(honest))
    launched = time.monotonic()
    run = BackgroundRun(cluster)
    out = spec.out_dir
    endpoints = await_endpoints(out / "run", ["server-0", "server-1", "proxy-0"], run)
    await_round(out / "server-0.jsonl", run)
    nodes = {p.name: p.pid for p in cluster.processes
             if p.name.startswith(("server", "proxy")) and p.pid is not None}
    sizes = shard_sizes(cfg)
    server = Target("server-1", endpoints["server-1"], 1, sizes[1])
    proxy = Target("proxy-0", endpoints["proxy-0"], 0, sizes[0])
    targets = [server, proxy]
    logs = {t.name: out / "logs" / f"{t.name}.log" for t in targets}
    logs_before = {name: log_bytes(path) for name, path in logs.items()}
    sampler = Sampler(nodes)
    sampler.start()
    halt = threading.Event()

    checked = {"at": 0.0, "going": True}

    def keep_going() -> bool:  # (the metrics file is read at most twice a second)
        now = time.monotonic()
        if now - checked["at"] > 0.5:
            checked["at"] = now
            checked["going"] = (run.alive
                                and last_round(out / "server-0.jsonl") < cfg.rounds - 20)
        return bool(checked["going"])

    def say(line: str) -> None:
        click.echo(f"[{time.monotonic() - launched:6.1f} s] {line}", err=True)

    round_at_start = last_round(out / "server-0.jsonl")
    giant_keys = {"giant": f"worker-{attackers.giant}",
                  "giant-silent": f"worker-{attackers.silent}"}
    giants = {name: Offender(name, server, ring.client_curve(key, server.shard), giant_message(),
                             name == "giant", halt) for name, key in giant_keys.items()}
    oversize = {t.name: Offender(f"oversize@{t.name}", t, t.curve(
        ring, f"worker-{attackers.oversize}"), oversize_message(t, attackers.oversize), True,
        halt) for t in targets}
    hostile = Attack(cfg, ring, targets, quota, attackers, options["window_wait_s"])
    straggler = Straggler(server, ring.client_curve(f"worker-{attackers.flood}", server.shard),
                          hello_message(cfg, "worker", attackers.flood), options["pace_s"] / 6,
                          halt)
    phases: dict[str, float] = {}
    attack_started = time.monotonic()
    try:
        straggler.start()
        for name, offender in giants.items():  # phase 1: each 2 GB class alone
            say(f"{name}: 2 GB messages from {giant_keys[name]} at server-1 for "
                f"{options['giant_seconds']:g} s")
            sampler.mark(name)
            begun = time.monotonic()
            offender.start()
            halt.wait(options["giant_seconds"])
            phases[name] = time.monotonic() - begun
        keyholders = keyholder_phases(cfg, ring, endpoints, nodes, out, attackers, sampler,
                                       options, say)
        sampler.mark("floods")  # phase 2: the floods (the giants go on)
        begun = time.monotonic()
        for offender in oversize.values():
            offender.start()
        held = hostile.hold_idle_connections(options["idle"])
        say(f"holding {held} idle connections; {len(hostile.floods)} classes of {quota:,} "
            f"frames, one after another at each target")
        hostile.strangers_try(options["strangers"])
        seconds = hostile.run(keep_going, say)
        phases["floods"] = time.monotonic() - begun
        say(f"floods over after {seconds:.1f} s")
        idle_open = hostile.idle_still_open()
        round_at_end = last_round(out / "server-0.jsonl")
        counters = {"server-1": s.counters if (s := hostile.status(server)) else None,
                    "server-0 (behind proxy-0)": s.counters if (s := hostile.status(
                        proxy, f"worker-{attackers.flood}")) else None}
    finally:
        halt.set()
        attack_seconds = time.monotonic() - attack_started
        for thread in [*giants.values(), *oversize.values(), straggler]:
            if thread.is_alive():
                thread.join()
        sampler.halt.set()
        hostile.close()
    logs_after = {name: log_bytes(path) for name, path in logs.items()}
    rss = {"baseline_mb": {n: round(v / 1024, 1) for n, v in sampler.baseline.items()},
           "samples": sampler.samples,
           "giant_alone": sampler.growth_mb("giant"),
           "giant_silent_alone": sampler.growth_mb("giant-silent"),
           "floods": sampler.growth_mb("floods"),
           "high_water_mark_growth_mb": sampler.hwm_growth_mb("start"),
           "overall": sampler.growth_mb(),
           "peak_at": {n: f"{phase} +{t:.2f} s" for n, (phase, t) in sampler.peak_at.items()}}
    say("attack over; waiting for the run to finish")
    result = run.join()
    crashes = [p.name for p in cluster.processes
               if p.returncode not in (0, None)]
    crashes += [f"{r['process']} (restarted)" for r in cluster.supervisor.restarts]
    if isinstance(result, BaseException):  # the honest run did not finish
        crashes.append((str(result).splitlines() or [repr(result)])[0][:300])
    reference, replayed = None, None
    if isinstance(result, ClusterResult):
        replayed = read_participation(out, cfg.num_shards, cfg.num_workers, cfg.rounds)
        pin_torch_threads(1)  # as the workers compute: the same sums in the same order
        reference = simulate(cfg, spec.attack, participation=replayed)
    server_lines = read_jsonl(out / "server-1.jsonl")
    barred = {"server-1": server_lines[-1].get("barred", []) if server_lines else [],
              "proxy-0": barred_in_log(logs["proxy-0"])}
    classes = [f.report(f.key in barred[f.target.name]) for f in hostile.floods]
    print_table(classes)
    flood_frames = {t.name: sum(c["frames"] for c in classes if c["target"] == t.name)
                    for t in targets}
    log_growth = {n: logs_after[n]["bytes"] - logs_before[n]["bytes"] for n in logs}
    holds = holds_in_log(logs["server-1"])
    first_barred = next((line for line in server_lines
                         if giant_keys["giant"] in line.get("barred", [])), None)
    summary = {
        "frames_per_class_per_target": quota,
        "classes_short_of_quota": [f"{c['target']}/{c['class']}" for c in classes
                                   if c["frames"] < quota],
        "hostile_frames": sum(c["frames"] for c in classes),
        "hostile_messages": sum(c["messages"] for c in classes),
        "error_replies": sum(n for c in classes for k, n in c["replies"].items()
                             if k not in ("welcome", "params", "statusreply")),
        "answered": sum(c["answered"] for c in classes),
        "no_reply": sum(c["no_reply"] for c in classes),
        "unanswered_by_nodes": sum(c["unanswered_by_node"] or 0 for c in classes),
        "attack_seconds": round(attack_seconds, 1),
        "flood_seconds": round(seconds, 1),
        "phase_seconds": {k: round(v, 1) for k, v in phases.items()},
        "honest_rounds_during_attack": [round_at_start, round_at_end],
        "honest_rounds_per_s_during_attack": round((round_at_end - round_at_start)
                                                   / max(attack_seconds, 1e-9), 2),
        "straggler": {"key": f"worker-{attackers.flood}", "target": server.name,
                      "hellos": straggler.hellos, "welcomes": straggler.welcomes},
        "idle_connections_held": held,
        "idle_connections_open_at_end": idle_open,
        "strangers": hostile.strangers,
        "crashes": len(crashes),
        "crashed": crashes,
        "server_counters": counters,
        "barred": barred,
        "giant": {name: {"key": key, **giants[name].report(key in barred["server-1"])}
                  for name, key in giant_keys.items()},
        "giant_first_barred_line": None if first_barred is None else {
            k: first_barred.get(k) for k in ("round", "closed", "missing", "barred")},
        "oversize": {n: {"key": f"worker-{attackers.oversize}",
                         **o.report(f"worker-{attackers.oversize}" in barred[n])}
                     for n, o in oversize.items()},
        "peak_rss_growth_mb": rss,
        "keyholders": keyholders,
        # what the in-flight guard's logged cuts at server-1 say a connection held (the
        # log is throttled: not every cut has its line)
        "holds_logged_at_server_1": holds,
        "log_bytes": {
            "during_attack": log_growth,
            "files_at_end": {n: logs_after[n]["files"] for n in logs},
            "flood_frames": flood_frames,
            "per_100k_hostile_frames": {n: round(log_growth[n] * 1e5 / max(1, flood_frames[n]))
                                        for n in logs},
        },
        "run_finished": isinstance(result, ClusterResult),
        "rounds_closed_short_replayed": replayed.rounds_closed_short if replayed else None,
        "bit_identical": bool(reference and isinstance(result, ClusterResult)
                              and reference.digest == result.digest),
    }
    return {"summary": summary, "classes": classes}


def await_endpoints(run_dir: Path, names: list[str], run: BackgroundRun) -> dict[str, str]:
    """The endpoints the nodes ``names`` wrote to their ready files in ``run_dir``."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and run.alive:
        files = {n: run_dir / f"{n}.endpoint" for n in names}
        if all(f.exists() for f in files.values()):
            return {n: f.read_text().strip() for n, f in files.items()}
        time.sleep(0.1)
    raise click.ClickException("the cluster did not come up")


def await_round(metrics: Path, run: BackgroundRun) -> None:
    """Until the metrics file records a round (the cluster trains)."""
    deadline = time.monotonic() + 300
    while last_round(metrics) < 1:
        if time.monotonic() > deadline or not run.alive:
            raise click.ClickException("the cluster did not start training")
        time.sleep(0.1)
