"""``ps-server``: one server process hosting a set of the S shards."""

from __future__ import annotations

from typing import Any

import click

from common.conf.settings import take
from common.net.keys import SecurityOptions
from common.run.cli import settings_command
from common.run.commands import COMMANDS
from common.run.config import RunConfig
from common.run.process import ProcessOptions, run_process
from server.options import ServerOptions

COMMAND = COMMANDS["ps-server"]


def build_command() -> click.Command:
    """The ``ps-server`` command, its options derived from the settings declarations."""

    @settings_command(COMMAND, COMMANDS)
    def main(**values: Any) -> None:
        """Run one server process: aggregate its --shard(s) of the model with the rule.

        The process waits for the n workers' gradients of each round (or, with
        --round-timeout, for the --quorum that is in at the round's deadline),
        aggregates them coordinate-wise with --rule, updates its parameters and serves
        the next round, for --rounds rounds.
        """
        roles = COMMAND.roles
        options = take(ServerOptions, values, roles)
        process = take(ProcessOptions, values, roles)
        security = take(SecurityOptions, values, roles)

        def start() -> None:
            cfg = take(RunConfig, values, roles).validate()
            keys = security.ring(COMMAND.name)
            options.check(cfg)
            from common.learn.rules.defence import probe_defence
            from common.run.model_init import initial_parameters
            from server.node import serve

            probe_defence(cfg)  # a broken rule (a plugin's) refused now, in one line

            serve(cfg, options, process, initial_parameters(cfg), keys)

        run_process(f"server[{options.shard}]", process, start, uses_torch=True)

    return main


main = build_command()

if __name__ == "__main__":
    main()
