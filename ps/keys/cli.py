"""``ps-keys``: write the CURVE key pairs of a run into a directory, and optionally one
bundle per identity: a directory holding exactly the key files that identity's process
loads (``common.net.keys.needed_keys``), what a deployment mounts into its container."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

import click

from common.errors import ConfigError
from common.net.keys import PUBLIC_SUFFIX, SECRET_SUFFIX, create_keys, needed_keys
from common.run.cli import CONTEXT_SETTINGS, EPILOG

SECRET_MODE = 0o400  # read by its owner only: KeyRing refuses anything wider
PUBLIC_MODE = 0o444  # nobody writes a key in a bundle (the container mounts it read-only)
BUNDLE_MODE = 0o700


def _is_key(name: str) -> bool:
    return name.endswith((PUBLIC_SUFFIX, SECRET_SUFFIX))


def write_bundles(source: Path, bundles: Path, names: Iterable[str], num_shards: int,
                  num_workers: int, proxies: Iterable[int], force: bool) -> None:
    """``bundles/<name>/`` for each identity: exactly ``needed_keys(name, ...)`` copied
    from ``source`` (secret files 0400, public ones 0444, directories 0700).

    A key file already in a bundle is replaced with ``force`` (and refused without);
    a key file a bundle should not hold (left by an earlier run with more workers, or put
    there by anyone) is removed: a server admits every ``*.key`` of its directory.
    """
    proxies = tuple(proxies)
    previous = os.umask(0o077)
    try:
        bundles.mkdir(mode=BUNDLE_MODE, parents=True, exist_ok=True)
        plan = {name: needed_keys(name, num_shards, num_workers, proxies) for name in names}
        existing = [f"{name}/{f}" for name in plan if (bundles / name).is_dir()
                    for f in sorted(os.listdir(bundles / name)) if _is_key(f)]
        if existing and not force:
            raise ConfigError(f"{bundles} already holds key bundles ({', '.join(existing[:3])}"
                              f"{', ...' if len(existing) > 3 else ''}); --force replaces them")
        for name, files in plan.items():
            _write_bundle(source, bundles / name, files)
    finally:
        os.umask(previous)


def _write_bundle(source: Path, bundle: Path, files: list[str]) -> None:
    bundle.mkdir(mode=BUNDLE_MODE, exist_ok=True)
    if stat.S_IMODE(bundle.stat().st_mode) & 0o077:
        os.chmod(bundle, BUNDLE_MODE)  # ConfigError from KeyRing otherwise, at start
    for entry in os.listdir(bundle):
        if _is_key(entry) and entry not in files:
            (bundle / entry).unlink()
    for file in files:
        tmp = bundle / f".{file}.tmp"
        tmp.unlink(missing_ok=True)
        tmp.write_bytes((source / file).read_bytes())
        os.chmod(tmp, SECRET_MODE if file.endswith(SECRET_SUFFIX) else PUBLIC_MODE)
        os.replace(tmp, bundle / file)


def _ids(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError as exc:
        raise click.BadParameter(f"expected shard ids like 0,2, got {value!r}") from exc


@click.command(context_settings=CONTEXT_SETTINGS, epilog=EPILOG)
@click.option("--dir", "directory", required=True, type=click.Path(path_type=Path),
              help="Directory to write the keys into (created mode 0700).")
@click.option("--shards", "num_shards", required=True, type=click.IntRange(min=1),
              help="Number of shards S: keys server-0 .. server-<S-1> (a server process "
                   "hosting several shards uses the key of its first shard).")
@click.option("--workers", "num_workers", required=True, type=click.IntRange(min=1),
              help="Number of workers n: keys worker-0 .. worker-<n-1>.")
@click.option("--proxies", default="", callback=_ids, metavar="IDS",
              help="Server processes (by their first shard) fronted by a man-in-the-middle "
                   "ps-proxy (a test tool): keys proxy-<s>, which those servers trust to "
                   "relay. Never for a deployment.")
@click.option("--bundles", type=click.Path(path_type=Path), default=None,
              help="Also write BUNDLES/<identity>/ for every identity, holding exactly the "
                   "key files its process loads (its own .key_secret, the public keys it "
                   "checks; secret files 0400, directories 0700): what a deployment "
                   "mounts, read-only, into that identity's container alone.")
@click.option("--force", is_flag=True, help="Replace keys already in --dir (and --bundles).")
def main(directory: Path, num_shards: int, num_workers: int, proxies: tuple[int, ...],
         bundles: Path | None, force: bool) -> None:
    """Create the key pairs of a run: one per server, one per worker id, one for the
    evaluator (and one per proxy with --proxies), in ZeroMQ's certificate format.

    Each process gets the directory with --keys (PS_KEYS). A deployment gives each
    node only what it needs: its own <name>.key_secret and the public <name>.key files
    of the others; --bundles writes those directories (docker-compose.yml's keys
    service: the full set in its own tmpfs, one bundle per container).
    """
    bad = [s for s in proxies if s >= num_shards]
    try:
        if bad:
            raise ConfigError(f"--proxies names shards {bad}, not in 0..{num_shards - 1}")
        names = create_keys(directory, num_shards, num_workers, proxies, force=force)
        if bundles is not None:
            write_bundles(directory, bundles, names, num_shards, num_workers, proxies, force)
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(exc.exit_code) from exc
    click.echo(f"wrote {len(names)} key pairs to {directory}: {names[0]} .. {names[-1]}")
    if bundles is not None:
        click.echo(f"wrote {len(names)} key bundles to {bundles}/<identity>/")


if __name__ == "__main__":
    main()
