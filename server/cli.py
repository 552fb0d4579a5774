"""``ps-server``: one server node holding shard s of S."""

from __future__ import annotations

from pathlib import Path

import click

from common.cli_options import (
    CONTEXT_SETTINGS,
    EXIT_CODES_HELP,
    RUN_CONFIG_OPTIONS,
    exits_cleanly,
    option,
    pin_torch_threads,
    run_config_from,
    setup_logging,
)
from common.errors import ConfigError


@click.command(context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@option("--shard", env="SHARD", required=True, type=int, help="This node's shard index s (0..S-1).")
@option("--bind", env="BIND", default="tcp://127.0.0.1:5550",
        help="ZeroMQ endpoint to bind (use tcp://HOST:* for a free port; see --ready-file).")
@option("--out-dir", env="OUT_DIR", default=None, type=click.Path(file_okay=False, path_type=Path),
        help="Directory for metrics (server-<s>.jsonl) and checkpoints (shard-<s>.npz).")
@option("--ready-file", env="READY_FILE", default=None, type=click.Path(path_type=Path),
        help="Write the bound endpoint here once listening (for launchers).")
@option("--linger", "linger_s", env="LINGER", default=30.0, type=float,
        help="After the last round, keep serving this long (seconds) while an evaluator "
        "has not read the final parameters.")
@option("--checkpoint-every", env="CHECKPOINT_EVERY", default=1, type=click.IntRange(min=0),
        help="Save the shard (shard-<s>.npz in --out-dir, atomically) every K rounds; "
        "0: only at exit. It is always saved at exit and on SIGTERM.")
@option("--resume", env="RESUME", is_flag=True,
        help="Continue from the checkpoint in --out-dir, if any (workers re-push what "
        "the restarted server lost).")
@RUN_CONFIG_OPTIONS
@option("--verbose", "-v", env="VERBOSE", is_flag=True, help="Debug logging.")
@exits_cleanly
def main(shard: int, bind: str, out_dir: Path | None, ready_file: Path | None, linger_s: float,
         checkpoint_every: int, resume: bool, verbose: bool, **kwargs) -> None:
    """Run one server node: aggregate shard SHARD of the model with the robust rule.

    The node waits for the n workers' gradient shards of each round, aggregates
    them coordinate-wise with --rule, updates its parameters and serves the next
    round, for --rounds rounds.
    """
    setup_logging(f"server[{shard}]", verbose)
    cfg = run_config_from(kwargs)
    if not 0 <= shard < cfg.num_shards:
        raise ConfigError(f"--shard must be in 0..{cfg.num_shards - 1}, got {shard}")
    pin_torch_threads()
    from common.model_init import initial_parameters
    from server.node import ServerNode, ServerOptions

    options = ServerOptions(shard=shard, bind=bind, out_dir=out_dir, ready_file=ready_file,
                            linger_s=linger_s, checkpoint_every=checkpoint_every,
                            resume=resume)
    node = ServerNode(cfg, options, initial_parameters(cfg))
    node.install_signal_handlers()
    node.run()


if __name__ == "__main__":
    main()
