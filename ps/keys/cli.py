"""``ps-keys``: write the CURVE key pairs of a run into a directory."""

from __future__ import annotations

from pathlib import Path

import click

from common.cli import CONTEXT_SETTINGS, EPILOG
from common.errors import ConfigError
from common.keys import create_keys


def _ids(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError as exc:
        raise click.BadParameter(f"expected shard ids like 0,2, got {value!r}") from exc


@click.command(context_settings=CONTEXT_SETTINGS, epilog=EPILOG)
@click.option("--dir", "directory", required=True, type=click.Path(path_type=Path),
              help="Directory to write the keys into (created mode 0700).")
@click.option("--shards", "num_shards", required=True, type=click.IntRange(min=1),
              help="Number of servers S: keys server-0 .. server-<S-1>.")
@click.option("--workers", "num_workers", required=True, type=click.IntRange(min=1),
              help="Number of workers n: keys worker-0 .. worker-<n-1>.")
@click.option("--proxies", default="", callback=_ids, metavar="IDS",
              help="Shards fronted by a man-in-the-middle ps-proxy (a test tool): keys "
                   "proxy-<s>, which the servers trust to relay. Never for a deployment.")
@click.option("--force", is_flag=True, help="Replace keys already in --dir.")
def main(directory: Path, num_shards: int, num_workers: int, proxies: tuple[int, ...],
         force: bool) -> None:
    """Create the key pairs of a run: one per server, one per worker id, one for the
    evaluator (and one per proxy with --proxies), in ZeroMQ's certificate format.

    Each process gets the directory with --keys (PS_KEYS). A deployment gives each
    node only what it needs: its own <name>.key_secret and the public <name>.key files
    of the others.
    """
    bad = [s for s in proxies if s >= num_shards]
    try:
        if bad:
            raise ConfigError(f"--proxies names shards {bad}, not in 0..{num_shards - 1}")
        names = create_keys(directory, num_shards, num_workers, proxies, force=force)
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(exc.exit_code) from exc
    click.echo(f"wrote {len(names)} key pairs to {directory}: {names[0]} .. {names[-1]}")


if __name__ == "__main__":
    main()
