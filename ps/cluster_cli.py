"""``ps-cluster``: run a whole cluster as local processes, with live progress."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from common.cli_options import (
    CONTEXT_SETTINGS,
    EXIT_CODES_HELP,
    RUN_CONFIG_OPTIONS,
    SCENARIO_ATTACK_OPTIONS,
    exits_cleanly,
    option,
    run_config_from,
    scenario_attack_from,
    setup_logging,
)
from common.errors import PeerError


@click.command(context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@option("--out-dir", env="OUT_DIR", default=None, type=click.Path(file_okay=False, path_type=Path),
        help="Where logs/, metrics (*.jsonl), final shards and summary.json go "
        "[default: runs/<time>-<rule>].")
@option("--data-dir", env="DATA_DIR", default=None,
        help="Directory holding the dataset files (not needed for fashion-mnist from Debian).")
@SCENARIO_ATTACK_OPTIONS
@option("--eval-every", env="EVAL_EVERY", default=25, type=click.IntRange(min=1),
        help="Rounds between evaluations.")
@option("--eval-samples", env="EVAL_SAMPLES", default=None, type=click.IntRange(min=1),
        help="Evaluate on the first N test samples only (default: all).")
@option("--no-evaluator", env="NO_EVALUATOR", is_flag=True, help="Do not start the evaluator.")
@option("--host", env="HOST", default="127.0.0.1", help="Loopback address the nodes bind.")
@option("--timeout", "timeout_s", env="TIMEOUT", default=60.0, type=float,
        help="Workers' per-request timeout (seconds) before reconnecting.")
@option("--retries", env="RETRIES", default=3, type=click.IntRange(min=0),
        help="Workers' resends before giving up.")
@option("--run-timeout", "run_timeout_s", env="RUN_TIMEOUT", default=None, type=float,
        help="Stop everything (exit 4) if the run takes longer than this many seconds.")
@option("--verify", env="VERIFY", is_flag=True,
        help="Afterwards run the in-process reference engine with the same settings and "
        "check that the final parameters are bit-identical (exit 3 if not).")
@RUN_CONFIG_OPTIONS
@exits_cleanly
def main(out_dir: Path | None, data_dir: str | None, eval_every: int,
         eval_samples: int | None, no_evaluator: bool, host: str, timeout_s: float,
         retries: int, run_timeout_s: float | None, verify: bool, **kwargs) -> None:
    """Start S servers, proxies, n workers and the evaluator as local processes and
    train; show progress; leave logs and metrics in --out-dir.

    Example (the paper's gambler scenario on one of four servers):

        ps-cluster --rule marmed --proxy-attack gambler --rounds 300
    """
    setup_logging("cluster")
    cfg = run_config_from(kwargs)
    attack = scenario_attack_from(cfg, kwargs)
    from ps.cluster import Cluster, ClusterSpec

    out = out_dir or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.rule}"
    spec = ClusterSpec(cfg=cfg, attack=attack, out_dir=out, data_dir=data_dir, host=host,
                       eval_every=eval_every, eval_samples=eval_samples,
                       evaluator=not no_evaluator, timeout_s=timeout_s, retries=retries,
                       run_timeout_s=run_timeout_s)
    click.echo(f"starting {cfg.num_shards} servers, {cfg.num_workers} workers"
               f"{', ' + str(len(attack.proxy_shards)) + ' proxy' if attack.proxy_shards else ''}"
               f"{', evaluator' if spec.evaluator else ''}; rule {cfg.rule} (q={cfg.q}); "
               f"output in {out}", err=True)
    display = ProgressLine(cfg.rounds)
    result = Cluster(spec).run(display.update)
    display.finish()
    p = result.progress
    click.echo(f"done: {cfg.rounds} rounds in {result.seconds:.1f} s "
               f"({p.rounds_per_s:.1f} rounds/s)"
               + (f"; test top-1 {p.top1:.4f}, top-3 {p.top3:.4f}, loss {p.loss:.4f}"
                  if p.top1 is not None else ""))
    click.echo(f"final parameters sha256 {result.digest}")
    click.echo(f"logs and metrics: {out}")
    if verify:
        _verify(cfg, attack, data_dir, result.digest)


def _verify(cfg, attack, data_dir: str | None, digest: str) -> None:
    from common.cli_options import pin_torch_threads
    from ps.simulate import simulate

    pin_torch_threads()
    click.echo("running the in-process reference engine ...", err=True)
    reference = simulate(cfg, attack, data_dir=data_dir)
    if reference.digest != digest:
        raise PeerError(f"cluster and reference differ: {digest} != {reference.digest}")
    click.echo(f"verified: the reference engine ends with the same parameters "
               f"({reference.seconds:.1f} s, {cfg.rounds / reference.seconds:.1f} rounds/s)")


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
        text = f"round {p.round}/{self.rounds} | {p.rounds_per_s:5.1f} rounds/s{acc}"
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
