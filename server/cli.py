"""``ps-server``: one server node holding shard s of S."""

from __future__ import annotations

from typing import Any

import click

from common.cli import settings_command
from common.config import RunConfig
from common.errors import ConfigError
from common.keys import SecurityOptions
from common.process import ProcessOptions, run_process
from common.settings import take
from ps.commands import COMMANDS
from server.options import ServerOptions

COMMAND = COMMANDS["ps-server"]


def build_command() -> click.Command:
    """The ``ps-server`` command, its options derived from the settings declarations."""

    @settings_command(COMMAND)
    def main(**values: Any) -> None:
        """Run one server node: aggregate shard SHARD of the model with the robust rule.

        The node waits for the n workers' gradient shards of each round (or, with
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
            if not options.shard < cfg.num_shards:
                raise ConfigError(
                    f"--shard must be in 0..{cfg.num_shards - 1}, got {options.shard}")
            options.check(cfg)
            from common.model_init import initial_parameters
            from server.node import serve

            serve(cfg, options, process, initial_parameters(cfg), keys)

        run_process(f"server[{options.shard}]", process, start, uses_torch=True)

    return main


main = build_command()

if __name__ == "__main__":
    main()
