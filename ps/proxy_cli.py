"""``ps-proxy``: the man-in-the-middle process in front of one server."""

from __future__ import annotations

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
    run_config_from,
    setup_logging,
)
from common.config import PROXY_ATTACKS


@click.command(context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@option("--bind", env="PROXY_BIND", default="tcp://127.0.0.1:5650",
        help="Endpoint to bind where the workers expect the server (tcp://HOST:* for any port).")
@option("--server", env="PROXY_SERVER", required=True,
        help="Endpoint of the real server this proxy fronts.")
@option("--proxy-attack", env="PROXY_ATTACK", default="gambler",
        type=click.Choice(PROXY_ATTACKS),
        help="Corruption applied in flight: gambler/bitflip on every push value "
        "(generalized model), gaussian/omniscient replace the pushes of --proxy-victims.")
@int_list_option("--proxy-victims", env="PROXY_VICTIMS",
                 help="Worker ids whose pushes gaussian/omniscient replace.")
@option("--corrupt-params", env="CORRUPT_PARAMS", is_flag=True,
        help="Also corrupt PARAMS replies to workers (gambler/bitflip).")
@ATTACK_PARAMETER_OPTIONS
@option("--connect-timeout", "connect_timeout_s", env="CONNECT_TIMEOUT", default=120.0, type=float,
        help="Seconds to wait for the server to answer the proxy's handshake.")
@option("--out-dir", env="OUT_DIR", default=None, type=click.Path(file_okay=False, path_type=Path),
        help="Directory for metrics (proxy-<s>.jsonl: corrupted values per round).")
@option("--ready-file", env="READY_FILE", default=None, type=click.Path(path_type=Path),
        help="Write the bound endpoint here once listening (for launchers).")
@RUN_CONFIG_OPTIONS
@option("--verbose", "-v", env="VERBOSE", is_flag=True, help="Debug logging.")
@exits_cleanly
def main(bind: str, server: str, proxy_attack: str, proxy_victims: tuple[int, ...],
         corrupt_params: bool, connect_timeout_s: float, out_dir: Path | None,
         ready_file: Path | None, verbose: bool, **kwargs) -> None:
    """Relay between the workers and one server, corrupting values in flight.

    Workers connect to --bind instead of the server; the proxy forwards every
    request to --server and every reply back, corrupting PUSH payloads (and,
    with --corrupt-params, PARAMS replies) per --proxy-attack.
    """
    setup_logging("proxy", verbose)
    params = attack_parameters_from(kwargs)
    cfg = run_config_from(kwargs)
    from ps.proxy import Proxy, ProxyOptions

    # the proxy's shard is learnt from the server at handshake; validate ids against S
    attack = attack_config(cfg, proxy_attack=proxy_attack, proxy_victims=proxy_victims,
                           corrupt_params=corrupt_params, **params)
    proxy = Proxy(cfg, attack, ProxyOptions(bind=bind, server=server, out_dir=out_dir,
                                            ready_file=ready_file,
                                            connect_timeout_s=connect_timeout_s))
    import signal

    signal.signal(signal.SIGTERM, proxy.request_stop)
    signal.signal(signal.SIGINT, proxy.request_stop)
    proxy.run()


if __name__ == "__main__":
    main()
