"""``ps-simulate``: the reference engine from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import click

from common.cli_options import (
    CONTEXT_SETTINGS,
    EXIT_CODES_HELP,
    RUN_CONFIG_OPTIONS,
    SCENARIO_ATTACK_OPTIONS,
    exits_cleanly,
    option,
    pin_torch_threads,
    run_config_from,
    scenario_attack_from,
)


@click.command(context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@option("--data-dir", env="DATA_DIR", default=None, help="Directory holding the dataset files.")
@SCENARIO_ATTACK_OPTIONS
@option("--eval-every", env="EVAL_EVERY", default=25, type=click.IntRange(min=1),
        help="Rounds between evaluations.")
@option("--out", "out_path", env="OUT", default=None, type=click.Path(path_type=Path),
        help="Write the evaluations as JSON lines here.")
@RUN_CONFIG_OPTIONS
@exits_cleanly
def main(data_dir: str | None, eval_every: int, out_path: Path | None, **kwargs) -> None:
    """Run the same training as ps-cluster in one process (no sockets) and print
    test accuracy every --eval-every rounds and the final parameters' sha256.
    """
    cfg = run_config_from(kwargs)
    attack = scenario_attack_from(cfg, kwargs)
    pin_torch_threads()
    from common.data import load_dataset
    from ps.simulate import simulate
    from worker.evaluator import Evaluator

    dataset = load_dataset(cfg.dataset, data_dir, seed=cfg.seed)
    evaluator = Evaluator(cfg, dataset)
    records = []

    def report(t: int, sim) -> None:
        if t % eval_every and t != cfg.rounds:
            return
        e = evaluator.evaluate(sim.params())
        records.append({"round": t, "loss": e.loss, "top1": e.top1, "top3": e.top3})
        click.echo(f"round {t}: test loss {e.loss:.4f} top-1 {e.top1:.4f} top-3 {e.top3:.4f}")

    result = simulate(cfg, attack, dataset=dataset, on_round=report)
    click.echo(f"{cfg.rounds} rounds in {result.seconds:.1f} s "
               f"({cfg.rounds / result.seconds:.1f} rounds/s); "
               f"{result.corrupted_values} values corrupted in flight")
    click.echo(f"final parameters sha256 {result.digest}")
    if out_path is not None:
        out_path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


if __name__ == "__main__":
    main()
