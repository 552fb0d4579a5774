"""``ps-simulate``: the reference engine from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import click

from common.cli_options import (
    ATTACK_PARAMETER_OPTIONS,
    CONTEXT_SETTINGS,
    EXIT_CODES_HELP,
    RUN_CONFIG_OPTIONS,
    attack_config,
    attack_parameters_from,
    exits_cleanly,
    int_list_option,
    option,
    pin_torch_threads,
    run_config_from,
)
from common.config import PROXY_ATTACKS


@click.command(context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@option("--data-dir", env="DATA_DIR", default=None, help="Directory holding the dataset files.")
@option("--worker-attack", env="WORKER_ATTACK", default="none",
        type=click.Choice(["none", "gaussian", "omniscient", "signflip", "alie", "ipm"]),
        help="Classic model: what the --byzantine-workers send.")
@int_list_option("--byzantine-workers", env="BYZANTINE_WORKERS", help="Byzantine worker ids.")
@option("--proxy-attack", env="PROXY_ATTACK", default="none", type=click.Choice(PROXY_ATTACKS),
        help="Man-in-the-middle corruption on the --proxy-shards.")
@int_list_option("--proxy-shards", env="PROXY_SHARDS",
                 help="Shards behind a proxy (default 0 when --proxy-attack).")
@int_list_option("--proxy-victims", env="PROXY_VICTIMS",
                 help="Workers whose pushes a gaussian/omniscient proxy replaces.")
@option("--corrupt-params", env="CORRUPT_PARAMS", is_flag=True,
        help="Proxies also corrupt PARAMS replies to workers.")
@ATTACK_PARAMETER_OPTIONS
@option("--eval-every", env="EVAL_EVERY", default=25, type=click.IntRange(min=1),
        help="Rounds between evaluations.")
@option("--out", "out_path", env="OUT", default=None, type=click.Path(path_type=Path),
        help="Write the evaluations as JSON lines here.")
@RUN_CONFIG_OPTIONS
@exits_cleanly
def main(data_dir: str | None, worker_attack: str, byzantine_workers: tuple[int, ...],
         proxy_attack: str, proxy_shards: tuple[int, ...], proxy_victims: tuple[int, ...],
         corrupt_params: bool, eval_every: int, out_path: Path | None, **kwargs) -> None:
    """Run the same training as ps-cluster in one process (no sockets) and print
    test accuracy every --eval-every rounds and the final parameters' sha256.
    """
    params = attack_parameters_from(kwargs)
    cfg = run_config_from(kwargs)
    if proxy_attack != "none" and not proxy_shards:
        proxy_shards = (0,)
    attack = attack_config(
        cfg, worker_attack=worker_attack, byzantine_workers=byzantine_workers,
        proxy_attack=proxy_attack, proxy_shards=proxy_shards, proxy_victims=proxy_victims,
        corrupt_params=corrupt_params, **params,
    )
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
