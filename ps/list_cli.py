"""``ps-list``: every rule, pre-aggregator, attack, model and dataset, with its options,
defaults and preconditions (``ps/catalog.py``); ``--json`` for scripts."""

from __future__ import annotations

import json

import click

from common.cli import CONTEXT_SETTINGS
from ps.catalog import KINDS, as_json, as_text, catalog


@click.command("ps-list", context_settings=CONTEXT_SETTINGS)
@click.argument("kinds", nargs=-1, type=click.Choice(KINDS))
@click.option("--json", "as_json_flag", is_flag=True, help="One JSON list of the entries "
              "(kind, name, flag, summary, needs, details, options), for scripts.")
def main(kinds: tuple[str, ...], as_json_flag: bool) -> None:
    """List what a run can name: the rules (--rule), pre-aggregators (--pre), attacks
    (--worker-attack, --proxy-attack), models (--model) and datasets (--dataset), or only
    the KINDS given, each with its one-line summary, what it needs (e.g. Krum: n > 2q + 2)
    and the settings of its options with their defaults."""
    entries = catalog(kinds or KINDS)
    if as_json_flag:
        click.echo(json.dumps(as_json(entries), indent=2))
    else:
        click.echo(as_text(entries))


if __name__ == "__main__":
    main()
