"""``ps-simulate``: the reference engine from the command line."""

from __future__ import annotations

from typing import Any

import click

from common.conf.settings import take
from common.run.cli import settings_command
from common.run.commands import COMMANDS
from common.run.config import AttackConfig, RunConfig, write_run_config
from common.run.metrics import JsonlWriter
from common.run.process import ProcessOptions, run_process
from ps.reference.options import ReplayOptions
from worker.options import ClientOptions, EvalOptions

COMMAND = COMMANDS["ps-simulate"]


def build_command() -> click.Command:
    """The ``ps-simulate`` command, its options derived from the settings declarations."""

    @settings_command(COMMAND, COMMANDS)
    def main(**values: Any) -> None:
        """Run the same training as ps-cluster in one process (no sockets) and print
        test accuracy every --eval-every rounds and the final parameters' sha256; with
        --out-dir, OUT_DIR gets the evaluations (evaluator.jsonl), each round's
        aggregation time per shard and values corrupted (engine.jsonl), config.json, each
        worker's class counts (partition.json) and the figures (accuracy.png,
        aggregation.png, corruption.png, partition.png). With --replay
        RUN_DIR, the rounds a cluster closed without some workers aggregate the same
        workers here (give that run's settings too).
        """
        roles = COMMAND.roles
        process = take(ProcessOptions, values, roles)

        def start() -> None:
            cfg = take(RunConfig, values, roles).validate()
            attack = AttackConfig.build(values, roles).validate(cfg)
            from common.learn.rules.defence import probe_defence

            probe_defence(cfg)  # a broken rule (a plugin's) refused now, in one line
            simulate_and_report(cfg, attack, take(ClientOptions, values, roles),
                                take(EvalOptions, values, roles), process,
                                take(ReplayOptions, values, roles))

        run_process("simulate", process, start, uses_torch=True)

    return main


def simulate_and_report(cfg: RunConfig, attack: AttackConfig, client: ClientOptions,
                        evaluation: EvalOptions, process: ProcessOptions,
                        replay: ReplayOptions) -> None:
    from common.learn.data import run_dataset, write_partition
    from ps.plots.run_figures import ENGINE_FILE, draw_finished_run
    from ps.plots.tensorboard import run_events
    from ps.reference.engine import simulate
    from ps.reference.participation import read_participation
    from worker.device import resolve_device
    from worker.evaluator import Evaluator

    participation = None
    if replay.replay is not None:
        participation = read_participation(replay.replay, cfg.num_shards, cfg.num_workers,
                                           cfg.rounds)
        click.echo(f"replaying {replay.replay}: {participation.rounds_closed_short} shard "
                   "rounds closed without some workers")

    device = resolve_device(client.device)
    dataset = run_dataset(cfg, client.data_dir)
    evaluator = Evaluator(cfg, dataset, evaluation.eval_samples, device)
    out = process.out_dir
    if out:
        write_run_config(out, cfg, attack)
        write_partition(out, cfg, dataset)
    metrics = JsonlWriter(out / "evaluator.jsonl" if out else None)
    engine = JsonlWriter(out / ENGINE_FILE if out else None)
    corrupted = 0  # the engine's cumulative count after the previous round

    def report(t: int, sim) -> None:
        nonlocal corrupted
        engine.write({"round": t - 1,  # the round aggregated, as in server-<s>.jsonl
                      "lr": cfg.lr_at(t - 1),
                      "aggregation_ms": [m.aggregation_ms for m in sim.last_metrics],
                      "corrupted_values": sim.corrupted_values - corrupted})
        corrupted = sim.corrupted_values
        if t % evaluation.eval_every and t != cfg.rounds:
            return
        e = evaluator.evaluate(sim.params())
        metrics.write({"round": t, "loss": e.loss, "top1": e.top1, "top3": e.top3})
        click.echo(f"round {t}: {evaluator.split} loss {e.loss:.4f} top-1 {e.top1:.4f} "
                   f"top-3 {e.top3:.4f}")

    try:
        result = simulate(cfg, attack, dataset=dataset, on_round=report,
                          participation=participation, device=device)
    finally:
        metrics.close()
        engine.close()
    click.echo(f"{cfg.rounds} rounds in {result.seconds:.1f} s "
               f"({cfg.rounds / result.seconds:.1f} rounds/s); "
               f"{result.corrupted_values} values corrupted in flight")
    click.echo(f"final parameters sha256 {result.digest}")
    if out:
        draw_finished_run(out)
        events = run_events(out, evaluation.tensorboard_every)
        if events is not None:
            events.update()
            events.close()


main = build_command()

if __name__ == "__main__":
    main()
