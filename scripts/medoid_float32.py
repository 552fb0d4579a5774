"""Test the float32 hypothesis for Medoid under the omniscient attack by a run: our
Medoid (float64 distances) and a naive float32 Medoid on the same seeds
(``ps/experiments/medoid32.py``).

    python3 scripts/medoid_float32.py --out docs/results/medoid-float32 --seeds 3
"""

from __future__ import annotations

from pathlib import Path

import click

from ps.experiments.medoid32 import write


@click.command()
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Directory for medoid-float32.json.")
@click.option("--seeds", default=3, show_default=True, type=click.IntRange(1))
@click.option("--rounds", default=500, show_default=True, type=click.IntRange(1))
def main(out: Path, seeds: int, rounds: int) -> None:
    """Medoid and the float32 Medoid under the paper's omniscient scenario."""
    click.echo(write(out, seeds, rounds))


if __name__ == "__main__":
    main()
