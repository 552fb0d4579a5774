"""``ps-proxy``: the man-in-the-middle process in front of one server process."""

from __future__ import annotations

from typing import Any

import click

from common.conf.settings import take
from common.errors import ConfigError
from common.net.keys import SecurityOptions
from common.net.sharding import parse_shard_set
from common.run.cli import settings_command
from common.run.commands import COMMANDS
from common.run.config import AttackConfig, RunConfig
from common.run.process import ProcessOptions, run_process
from ps.proxy.options import ProxyOptions

COMMAND = COMMANDS["ps-proxy"]


def build_command() -> click.Command:
    """The ``ps-proxy`` command, its options derived from the settings declarations."""

    @settings_command(COMMAND, COMMANDS)
    def main(**values: Any) -> None:
        """Relay between the workers and one server process, corrupting values in flight.

        Workers connect to --bind instead of the server; the proxy forwards every
        request to --server and every reply back, corrupting PUSH payloads (and,
        with --corrupt-params, PARAMS replies) per --proxy-attack, on the server's
        shards in --proxy-shards (default: all it hosts), passing the others untouched.
        """
        roles = COMMAND.roles
        process = take(ProcessOptions, values, roles)

        def start() -> None:
            cfg = take(RunConfig, values, roles).validate()
            # the server's shards are learnt from it; it corrupts those in --proxy-shards
            # (all, if none given); ids are checked against S
            attack = AttackConfig.build(values, roles)
            targets = attack.proxy_shards or None
            attack = attack.validate(cfg)
            options = take(ProxyOptions, values, roles)
            if options.shard is not None:
                try:
                    parse_shard_set(options.shard, cfg.num_shards)
                except ConfigError as exc:
                    raise ConfigError(f"--shard: {exc}") from None
            keys = take(SecurityOptions, values, roles).ring(COMMAND.name)
            if keys is not None and options.shard is None:
                raise ConfigError("ps-proxy with --keys needs --shard (whose keys to use)")
            from ps.proxy.node import relay

            relay(cfg, attack, options, process, keys, targets)

        run_process("proxy", process, start)

    return main


main = build_command()

if __name__ == "__main__":
    main()
