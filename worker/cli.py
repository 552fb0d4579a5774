"""``ps-worker``: one worker (or, with --evaluate, the evaluator) of a run."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import click

from common.conf.settings import take
from common.errors import ConfigError
from common.net.keys import SecurityOptions
from common.run.cli import settings_command
from common.run.commands import COMMANDS
from common.run.config import AttackConfig, RunConfig
from common.run.process import ProcessOptions, run_process
from worker.options import ClientOptions, EvalOptions

COMMAND = COMMANDS["ps-worker"]


def build_command() -> click.Command:
    """The ``ps-worker`` command, its options derived from the settings declarations."""

    @settings_command(COMMAND, COMMANDS)
    def main(**values: Any) -> None:
        """Run one worker, or several (--worker-id 0-9): each round pull the parameters
        from every shard, compute a stochastic gradient on the worker's data partition,
        push each shard its slice. With --evaluate, run the evaluator instead.
        """
        roles = COMMAND.roles
        options = take(ClientOptions, values, roles)
        process = take(ProcessOptions, values, roles)
        name = "evaluator" if options.evaluate else f"worker[{options.worker_id}]"

        def start() -> None:
            cfg = take(RunConfig, values, roles).validate()
            keys = take(SecurityOptions, values, roles).ring(COMMAND.name)
            if options.evaluate:
                from worker.evaluator import run_evaluator

                run_evaluator(cfg, options, take(EvalOptions, values, roles), process.out_dir,
                              keys)
                return
            workers = options.worker_ids(cfg.num_workers)
            attack = AttackConfig.build(values, roles)
            if attack.worker_attack != "none" and not attack.byzantine_workers:
                if len(workers) > 1:
                    raise ConfigError("--worker-attack in a process of several workers: name "
                                      "the Byzantine ones with --byzantine-workers")
                attack = replace(attack, byzantine_workers=workers)
            attack = attack.validate(cfg)
            if attack.worker_attack != "none" and not any(map(attack.is_byzantine, workers)):
                raise ConfigError(f"--worker-attack given but no worker of --worker-id "
                                  f"{options.worker_id} is in --byzantine-workers")
            from worker.run import run_worker

            run_worker(cfg, attack, options, process.out_dir, keys)

        run_process(name, process, start, uses_torch=True)

    return main


main = build_command()

if __name__ == "__main__":
    main()
