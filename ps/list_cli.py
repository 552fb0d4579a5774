"""``ps-list``: every rule, pre-aggregator, attack, model and dataset, with its options,
defaults and preconditions (``ps/catalog.py``); ``--json`` for scripts."""

from __future__ import annotations

import json

import click

from common.errors import ConfigError
from common.run import plugins
from common.run.cli import CONTEXT_SETTINGS
from ps.catalog import KINDS, as_json, as_text, catalog


@click.command("ps-list", context_settings=CONTEXT_SETTINGS)
@click.argument("kinds", nargs=-1, type=click.Choice(KINDS))
@click.option("--json", "as_json_flag", is_flag=True, help="One JSON list of the entries "
              "(kind, name, flag, summary, needs, details, options), for scripts.")
@click.option("--plugin", "paths", multiple=True, metavar="MODULE:NAME",
              help="Also list a plugin named by dotted path (repeatable); installed "
                   "packages' entry points are listed anyway.")
def main(kinds: tuple[str, ...], as_json_flag: bool, paths: tuple[str, ...]) -> None:
    """List what a run can name: the rules (--rule), pre-aggregators (--pre), attacks
    (--worker-attack, --proxy-attack), models (--model) and datasets (--dataset), or only
    the KINDS given, each with its one-line summary, what it needs (e.g. Krum: n > 2q + 2)
    and the settings of its options with their defaults."""
    try:
        plugins.load_plugins({})  # the installed packages' entry points
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    for path in paths:
        try:
            plugins.load_any(path)
        except ConfigError as exc:
            raise click.BadParameter(str(exc), param_hint="--plugin") from None
    entries = catalog(kinds or KINDS)
    if as_json_flag:
        click.echo(json.dumps(as_json(entries), indent=2))
    else:
        click.echo(as_text(entries))


if __name__ == "__main__":
    main()
