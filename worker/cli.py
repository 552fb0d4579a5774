"""``ps-worker``: one worker (or, with --evaluate, the evaluator) of a run."""

from __future__ import annotations

from pathlib import Path

import click

from common.cli_options import (
    ATTACK_PARAMETER_OPTIONS,
    CONTEXT_SETTINGS,
    EXIT_CODES_HELP,
    RUN_CONFIG_OPTIONS,
    WORKER_ATTACKS,
    attack_config,
    attack_parameters_from,
    exits_cleanly,
    int_list_option,
    option,
    pin_torch_threads,
    run_config_from,
    setup_logging,
    terminate_on_sigterm,
)
from common.errors import ConfigError


@click.command(context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@option("--servers", env="SERVERS", required=True,
        help="Comma-separated endpoints of shards 0..S-1, in order (a proxy's endpoint "
        "stands in for the server it fronts), e.g. tcp://10.0.0.1:5550,tcp://10.0.0.2:5550.")
@option("--worker-id", "worker", env="WORKER_ID", default=None, type=int,
        help="This worker's id i in 0..n-1 (required unless --evaluate).")
@option("--evaluate", env="EVALUATE", is_flag=True,
        help="Run as the evaluator: read-only, measures test loss/top-1/top-3 every "
        "--eval-every rounds.")
@option("--eval-every", env="EVAL_EVERY", default=10, type=click.IntRange(min=1),
        help="Evaluator: rounds between evaluations (the last round is always evaluated).")
@option("--eval-samples", env="EVAL_SAMPLES", default=None, type=click.IntRange(min=1),
        help="Evaluator: evaluate on the first N test samples only (default: all).")
@option("--data-dir", env="DATA_DIR", default=None,
        help="Directory holding the dataset files (MNIST IDX, CIFAR-10 python batches).")
@option("--attack", env="ATTACK", default="none",
        type=click.Choice(WORKER_ATTACKS),
        help="Make this worker Byzantine (classic model): the vector it sends.")
@int_list_option("--byzantine-workers", env="BYZANTINE_WORKERS",
                 help="All colluding Byzantine worker ids (default: only this worker).")
@ATTACK_PARAMETER_OPTIONS
@option("--timeout", "timeout_s", env="TIMEOUT", default=60.0, type=float,
        help="Seconds to wait for each reply before reconnecting and resending.")
@option("--retries", env="RETRIES", default=3, type=click.IntRange(min=0),
        help="Resends before giving up with exit code 4.")
@option("--out-dir", env="OUT_DIR", default=None, type=click.Path(file_okay=False, path_type=Path),
        help="Directory for metrics (worker-<i>.jsonl or evaluator.jsonl).")
@RUN_CONFIG_OPTIONS
@option("--verbose", "-v", env="VERBOSE", is_flag=True, help="Debug logging.")
@exits_cleanly
def main(servers: str, worker: int | None, evaluate: bool, eval_every: int,
         eval_samples: int | None, data_dir: str | None, attack: str,
         byzantine_workers: tuple[int, ...], timeout_s: float, retries: int,
         out_dir: Path | None, verbose: bool, **kwargs) -> None:
    """Run one worker: each round pull the parameters from every shard, compute a
    stochastic gradient on this worker's data partition, push each shard its slice.
    """
    setup_logging("evaluator" if evaluate else f"worker[{worker}]", verbose)
    terminate_on_sigterm()
    params = attack_parameters_from(kwargs)
    cfg = run_config_from(kwargs)
    endpoints = [e.strip() for e in servers.split(",") if e.strip()]
    pin_torch_threads()
    from worker.client import RetryPolicy

    policy = RetryPolicy(timeout_s=timeout_s, retries=retries)
    if evaluate:
        from worker.evaluator import run_evaluator

        run_evaluator(cfg, endpoints, data_dir, eval_every, policy, out_dir, eval_samples)
        return
    if worker is None:
        raise ConfigError("--worker-id (PS_WORKER_ID) is required for a worker")
    byzantine = byzantine_workers or ((worker,) if attack != "none" else ())
    attacks = attack_config(cfg, worker_attack=attack, byzantine_workers=byzantine, **params)
    if attack != "none" and worker not in byzantine:
        raise ConfigError(f"--attack given but worker {worker} is not in --byzantine-workers")
    from worker.run import run_worker

    run_worker(cfg, attacks, endpoints, worker, data_dir, policy, out_dir)


if __name__ == "__main__":
    main()
