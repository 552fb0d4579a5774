"""``ps-report``: redraw the figures of a finished run."""

from __future__ import annotations

from pathlib import Path

import click

from common.errors import EXIT_CODES_TEXT, ConfigError
from common.run.process import ProcessOptions, run_process


@click.command(epilog=EXIT_CODES_TEXT)
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
def main(run_dir: Path) -> None:
    """Redraw the figures of the run in RUN_DIR (a ps-cluster or ps-simulate --out-dir,
    or a docker-compose runs directory, whose <service>/ directories hold each
    process's <service>.jsonl) and print their paths:

    \b
    accuracy.png     test top-1, top-3 and loss against rounds (evaluator.jsonl)
    round_time.png   compute and exchange time per worker, and their median
                     over workers against rounds (worker-<i>.jsonl)
    corruption.png   values each proxy corrupted per round (proxy-<s>.jsonl,
                     or ps-simulate's engine.jsonl)
    aggregation.png  aggregation time per round of each shard (server-<s>.jsonl,
                     or engine.jsonl)
    partition.png    training samples of each class per worker (partition.json)

    A figure whose files are missing or empty is skipped; titles name the rule and
    attack from config.json.
    """

    def start() -> None:
        from ps.plots.run_figures import draw_run

        written = draw_run(run_dir)
        if not written:
            raise ConfigError(f"nothing to draw in {run_dir}: no metrics in evaluator.jsonl, "
                              "worker-<i>.jsonl, proxy-<s>.jsonl, server-<s>.jsonl or "
                              "engine.jsonl (nor in <name>/), no partition.json; is it a "
                              "ps-cluster or ps-simulate --out-dir, or a compose runs "
                              "directory?")
        for path in written:
            click.echo(path)

    run_process("report", ProcessOptions(), start)


if __name__ == "__main__":
    main()
