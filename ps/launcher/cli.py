"""``ps-cluster``: run a whole cluster as local processes, with live progress."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from common.conf.settings import take
from common.errors import ConfigError, ReferenceMismatch
from common.learn.attacks import VectorAttack
from common.net.keys import SecurityOptions
from common.net.sharding import format_shard_set
from common.run.cli import settings_command
from common.run.commands import COMMANDS
from common.run.config import AttackConfig, RunConfig
from common.run.metrics import read_jsonl
from common.run.process import ProcessOptions, pin_torch_threads, run_process
from ps.launcher.options import ClusterOptions
from server.options import ServerOptions
from worker.options import ClientOptions, EvalOptions

if TYPE_CHECKING:
    from ps.launcher.report import Progress

COMMAND = COMMANDS["ps-cluster"]
# what --resume takes from its own command line; every other setting is the run's
RESUME_OWN_OPTIONS = ("verify", "max_restarts", "run_timeout_s", "worker_processes")


def build_command() -> click.Command:
    """The ``ps-cluster`` command, its options derived from the settings declarations."""

    @settings_command(COMMAND, COMMANDS)
    def main(**values: Any) -> None:
        """Start S servers, proxies, n workers and the evaluator as local processes and
        train; show progress; leave logs and metrics in --out-dir.

        Each process gets its settings as flags derived from the same declarations as
        ps-server, ps-proxy and ps-worker (a deployment starts those one by one).

        Example (the paper's gambler scenario on one of four servers):

            ps-cluster --rule marmed --proxy-attack gambler --rounds 300
        """
        process = take(ProcessOptions, values, COMMAND.roles)
        run_process("cluster", process, lambda: launch(values, process))

    return main


def spec_from(values: dict[str, Any], process: ProcessOptions):
    """The ``ClusterSpec`` that command values describe (validated)."""
    from ps.launcher.cluster import ClusterSpec

    roles = COMMAND.roles
    cfg = take(RunConfig, values, roles).validate()
    attack = AttackConfig.build(values, roles).validate(cfg)
    out = process.out_dir or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.rule}"
    return ClusterSpec(cfg=cfg, attack=attack, out_dir=out,
                       client=take(ClientOptions, values, roles),
                       evaluation=take(EvalOptions, values, roles),
                       cluster=take(ClusterOptions, values, roles),
                       server=take(ServerOptions, values, roles),
                       security=take(SecurityOptions, values, roles),
                       process=replace(process, out_dir=out))


def launch(values: dict[str, Any], process: ProcessOptions) -> None:
    from ps.launcher.cluster import Cluster, resumable_spec
    from ps.plots.run_figures import draw_finished_run
    from ps.plots.tensorboard import run_events

    spec = spec_from(values, process)
    if spec.cluster.resume is not None:  # the run's settings; this command's own options
        values, process = saved_values(spec.cluster.resume)
        saved = spec_from(values, process)
        if saved.cluster.server_processes is None:  # a run from before server processes:
            saved = replace(saved, cluster=replace(  # one per shard, as it ran
                saved.cluster, server_processes=saved.cfg.num_shards))
        own = {name: getattr(spec.cluster, name) for name in RESUME_OWN_OPTIONS}
        spec = resumable_spec(replace(saved, cluster=replace(saved.cluster, **own),
                                      security=resumed_security(
                                          saved.security, spec.security, saved.out_dir)))
    cfg, attack, out = spec.cfg, spec.attack, spec.out_dir
    from worker.device import select_device

    select_device(spec.client.device)  # CUDA asked for and absent: one line, nothing started
    slow = slow_curve(spec.security)
    if slow:
        click.echo(f"warning: {slow}", err=True)
    evaluator = not spec.cluster.no_evaluator
    blocks = spec.cluster.blocks(cfg.num_shards)
    proxied = [b for b in blocks if set(b) & set(attack.proxy_shards)]
    proxies = (f", {len(proxied)} prox{'y' if len(proxied) == 1 else 'ies'} (corrupting "
               f"shard{'s' if len(attack.proxy_shards) > 1 else ''} "
               f"{format_shard_set(attack.proxy_shards)})"
               if attack.proxy_attack != "none" else "")
    servers = (f"{cfg.num_shards} servers" if len(blocks) == cfg.num_shards else
               f"{cfg.num_shards} shards on {len(blocks)} server processes")
    teams = len(spec.cluster.worker_blocks(cfg.num_workers))
    workers = (f"{cfg.num_workers} workers" if teams == cfg.num_workers else
               f"{cfg.num_workers} workers in {teams} processes")
    click.echo(f"starting {servers}, {workers}{proxies}"
               f"{', evaluator' if evaluator else ''}; rule {cfg.rule} (q={cfg.q}); "
               f"output in {out}", err=True)
    display = ProgressLine(cfg.rounds)
    events = run_events(out, spec.evaluation.tensorboard_every)  # if installed: following the run

    def on_progress(progress: Progress) -> None:
        display.update(progress)
        if events is not None:
            events.update(progress.restarts, progress.round)

    try:
        result = Cluster(spec).run(on_progress)
    finally:
        if events is not None:
            events.update()
            events.close()
    display.finish()
    click.echo(summary_line(cfg.rounds, result.seconds, result.progress,
                            "validation" if cfg.validation else "test"))
    click.echo(f"final parameters sha256 {result.digest}")
    click.echo(f"logs and metrics: {out}")
    draw_finished_run(out)
    if spec.cluster.verify:
        verify(spec, result.digest)


def slow_curve(security: SecurityOptions) -> str:
    """With keys, CURVE's throughput measured here (16 MiB, tens of ms; the pyzmq wheel's
    libsodium decides it: ``ps-doctor``): a warning if it would hold the run back, else
    "". Nothing of ZeroMQ is left running (the launcher forks afterwards)."""
    if security.insecure:
        return ""
    from ps.doctor.checks import CURVE_QUICK_MESSAGES, curve_warning, wire_throughput

    return curve_warning(wire_throughput(True, CURVE_QUICK_MESSAGES))


def summary_line(rounds: int, seconds: float, p, split: str = "test") -> str:
    """The line a finished run prints: its wall time (start-up included), then the
    training rate over the span it is measured on (server 0's rounds after its first,
    start-up excluded), with that span, so that each figure says what it covers; the
    last evaluation, on ``split`` (``test``, or ``validation`` under ``--validation``)."""
    line = f"done: {rounds} rounds in {seconds:.1f} s wall time (start-up included)"
    if p.timed_rounds:
        line += (f"; the last {p.timed_rounds} rounds in {p.span_s:.2f} s, "
                 f"{p.rounds_per_s:.1f} rounds/s")
    if p.top1 is not None:
        line += f"; {split} top-1 {p.top1:.4f}, top-3 {p.top3:.4f}, loss {p.loss:.4f}"
    return line


def resumed_security(saved: SecurityOptions, given: SecurityOptions,
                     out_dir: Path) -> SecurityOptions:
    """The security settings a resumed run uses: those of this command line (and its
    environment: ``--keys``, ``--insecure``), never those of the run directory's saved
    command (``command.json``), which anyone who can write the run directory may have
    edited (to point ``--keys`` at keys of their own, or to turn keys off). The saved
    command only has to agree: ``ConfigError`` (one line, saying what to pass) where the
    run was started with other settings than this command line says.

    * started with ``--insecure``: resume with ``--insecure`` (its checkpoints carry no
      key);
    * started with ``--keys DIR``: resume with ``--keys DIR`` (the same directory); a
      command line that names no ``--keys`` is refused, not given ``DIR``;
    * started with neither, i.e. with keys generated for the run in ``<run-dir>/keys``:
      resume with neither (or with ``--keys <run-dir>/keys``), and the run uses
      ``<run-dir>/keys`` (``resumable_spec``). That directory is the only key directory
      a resume takes without being told: it is where this run's keys were written, and
      it is read through :class:`common.net.keys.KeyRing` like any other, which refuses it
      unless it, every key file in it and every directory above it (the run directory
      included) belong to this user (or root) and nobody else may write them: whoever
      edited ``command.json`` to make a run look as if its keys were generated cannot
      plant keys there. Without that directory (and without checkpoints) new keys are
      generated there, as for a fresh run.
    """
    if given.insecure and given.keys is not None:
        raise ConfigError("ps-cluster --resume: --keys and --insecure contradict each other")
    run_keys = out_dir / "keys"
    if saved.insecure == given.insecure and (
            given.insecure or _same_directory(saved.keys or run_keys, given.keys or run_keys)):
        return SecurityOptions(insecure=True) if given.insecure else SecurityOptions(
            keys=given.keys)
    if saved.insecure:
        started, fix = "--insecure (its checkpoints carry no key)", "resume it with --insecure"
    elif saved.keys is not None:
        started, fix = f"--keys {saved.keys}", f"pass --keys {saved.keys} explicitly"
    else:
        started = f"the keys generated for it in {run_keys}"
        fix = "resume it with neither --keys nor --insecure"
    now = ("says --insecure" if given.insecure else f"says --keys {given.keys}"
           if given.keys is not None else "names neither --keys nor --insecure")
    raise ConfigError(f"cannot resume {out_dir}: it was started with {started} and this "
                      f"command line {now}; {fix} (--resume takes its security settings from "
                      f"its own command line, never from the run's saved command)")


def _same_directory(a: Path, b: Path) -> bool:
    """Whether paths ``a`` and ``b`` name the same directory (the same one if both exist,
    else the same path once made absolute and its links resolved)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def saved_values(out_dir: Path) -> tuple[dict[str, Any], ProcessOptions]:
    """The command values a run in ``out_dir`` was started with; ``ConfigError`` if none."""
    from ps.launcher.cluster import COMMAND_FILE

    path = out_dir / COMMAND_FILE
    try:
        argv = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot resume {out_dir}: {path} is missing or unreadable "
                          f"({exc}); is it a ps-cluster output directory?") from exc
    context = build_command().make_context(COMMAND.name, list(argv))
    values = context.params
    return values, replace(take(ProcessOptions, values, COMMAND.roles),
                           out_dir=out_dir)


def verify(spec, digest: str) -> None:
    """Run the reference engine with the same settings, aggregating in each round the
    workers the cluster did; ``ReferenceMismatch`` (exit 5) if it differs."""
    pin_torch_threads(spec.process.torch_threads)
    from ps.reference.engine import simulate
    from ps.reference.participation import read_participation

    cfg = spec.cfg
    # an attack's memory from round to round (mimic-adaptive's) lives in the process too
    remembers = any(isinstance(a, VectorAttack) and a.stateful
                    for a in spec.attack.active(spec.attack.worker_attack))
    if cfg.worker_momentum or remembers:
        broken = momentum_breaks(spec.out_dir, cfg.num_workers, cfg.rounds)
        if broken:
            what = " and ".join(w for w, on in (("--worker-momentum", cfg.worker_momentum),
                                               (f"--worker-attack {spec.attack.worker_attack}",
                                                remembers)) if on)
            raise ConfigError(
                f"--verify cannot reproduce this run: with {what} each worker's momentum "
                f"or attack memory lives in its process, and worker(s) "
                f"{', '.join(map(str, broken))} restarted or skipped rounds (theirs started "
                "again from scratch), which the reference engine does not model")
    participation = read_participation(spec.out_dir, cfg.num_shards, cfg.num_workers,
                                       cfg.rounds)
    click.echo(f"running the in-process reference engine ({participation.rounds_closed_short} "
               "shard rounds closed without some workers) ...", err=True)
    from worker.device import resolve_device

    reference = simulate(spec.cfg, spec.attack, data_dir=spec.client.data_dir,
                         participation=participation,
                         device=resolve_device(spec.client.device))
    if reference.digest != digest:
        raise ReferenceMismatch(f"cluster and reference differ: {digest} != "
                                f"{reference.digest}")
    click.echo(f"verified: the reference engine ends with the same parameters "
               f"({reference.seconds:.2f} s, {spec.cfg.rounds / reference.seconds:.1f} "
               "rounds/s)")


def momentum_breaks(out_dir: Path, num_workers: int, rounds: int) -> list[int]:
    """Workers whose metrics show a process started after round 0 (a restart or a
    resumed run) or a round they did not compute: their momentum (or a stateful attack's
    memory) is not the engine's."""
    broken = []
    for i in range(num_workers):
        records = read_jsonl(out_dir / f"worker-{i}.jsonl")
        computed = [r["round"] for r in records]
        if (computed != list(range(rounds))
                or any(r.get("started_at", 0) != 0 for r in records)):
            broken.append(i)
    return broken


class ProgressLine:
    """One status line, redrawn in place on a terminal, printed every few seconds otherwise."""

    def __init__(self, rounds: int, every_s: float = 5.0) -> None:
        self.rounds = rounds
        self.tty = sys.stderr.isatty()
        self.every_s = every_s
        self.last_print = 0.0
        self.text = ""

    def update(self, p) -> None:
        acc = f" | top-1 {p.top1:.3f} @ round {p.eval_round}" if p.top1 is not None else ""
        restarts = f" | {p.restarts} restarts" if p.restarts else ""
        text = f"round {p.round}/{self.rounds} | {p.rounds_per_s:5.1f} rounds/s{acc}{restarts}"
        now = time.monotonic()
        if self.tty:
            sys.stderr.write("\r" + text.ljust(len(self.text)))
            sys.stderr.flush()
        elif text != self.text and now - self.last_print >= self.every_s:
            sys.stderr.write(text + "\n")
            self.last_print = now
        self.text = text

    def finish(self) -> None:
        if self.tty and self.text:
            sys.stderr.write("\n")


main = build_command()

if __name__ == "__main__":
    main()
