"""``ps-doctor``: check what this machine gives a run before starting one.

It reports the versions that decide the speed, CURVE's throughput against plain ZMTP
(and warns under 0.3 GB/s: a slow libsodium in the pyzmq wheel), the aggregation
kernels, torch's threads, the CUDA devices and the device each worker process of a
``ps-cluster --device ...`` would compute on. Exit 0; with ``--strict``, 1 if anything
warned.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from common.run.cli import CONTEXT_SETTINGS
from ps.doctor import checks


@click.command("ps-doctor", context_settings=CONTEXT_SETTINGS)
@click.option("--device", default="auto", show_default=True, help="The --device whose "
              "placement to show (cpu, cuda, cuda:N, auto).")
@click.option("--workers", "-n", default=20, show_default=True, type=click.IntRange(min=1),
              help="The run's n, for the placement of its worker processes.")
@click.option("--worker-processes", default=None, type=click.IntRange(min=1),
              help="The run's worker processes (default ps-cluster's: min(n, 2 x cores)).")
@click.option("--messages", default=16, show_default=True, type=click.IntRange(min=1),
              help="Messages of 4 MiB timed for each wire figure.")
@click.option("--skip", multiple=True, type=click.Choice(["wire", "kernels", "cuda"]),
              help="Leave a check out (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="One JSON list of the findings.")
@click.option("--strict", is_flag=True, help="Exit 1 if any check warned.")
def main(device: str, workers: int, worker_processes: int | None, messages: int,
         skip: tuple[str, ...], as_json: bool, strict: bool) -> None:
    """Check this machine for a run: versions, CURVE's speed (a slow pyzmq wheel makes a
    keyed cluster crawl), the aggregation kernels, torch's threads, the CUDA devices, and
    where each worker process would compute."""
    findings = checks.versions()
    if "wire" not in skip:
        findings += checks.wire(messages)
    if "kernels" not in skip:
        findings += checks.kernels()
    findings += checks.threads()
    if "cuda" not in skip:
        findings += checks.cuda()
    findings += checks.placement(device, workers, worker_processes)
    if as_json:
        click.echo(json.dumps([asdict(f) for f in findings], indent=2))
    else:
        for f in findings:
            click.echo(f"{f.check:<10} {f.found}")
            if f.warning:
                click.echo(f"{'':<10} WARNING: {f.warning}")
    if strict and any(f.warning for f in findings):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
