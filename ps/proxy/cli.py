"""``ps-proxy``: the man-in-the-middle process in front of one server."""

from __future__ import annotations

from typing import Any

import click

from common.cli import settings_command
from common.config import AttackConfig, RunConfig
from common.errors import ConfigError
from common.keys import SecurityOptions
from common.process import ProcessOptions, run_process
from common.settings import take
from ps.commands import COMMANDS
from ps.proxy.options import ProxyOptions

COMMAND = COMMANDS["ps-proxy"]


def build_command() -> click.Command:
    """The ``ps-proxy`` command, its options derived from the settings declarations."""

    @settings_command(COMMAND)
    def main(**values: Any) -> None:
        """Relay between the workers and one server, corrupting values in flight.

        Workers connect to --bind instead of the server; the proxy forwards every
        request to --server and every reply back, corrupting PUSH payloads (and,
        with --corrupt-params, PARAMS replies) per --proxy-attack.
        """
        roles = COMMAND.roles
        process = take(ProcessOptions, values, roles)

        def start() -> None:
            cfg = take(RunConfig, values, roles).validate()
            # the proxy's shard is learnt from the server; ids are checked against S
            attack = AttackConfig.build(values, roles, proxy_shards=(0,)).validate(cfg)
            options = take(ProxyOptions, values, roles)
            keys = take(SecurityOptions, values, roles).ring(COMMAND.name)
            if keys is not None and options.shard is None:
                raise ConfigError("ps-proxy with --keys needs --shard (whose keys to use)")
            from ps.proxy.node import relay

            relay(cfg, attack, options, process, keys)

        run_process("proxy", process, start)

    return main


main = build_command()

if __name__ == "__main__":
    main()
