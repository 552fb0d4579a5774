"""Benchmark the aggregation rules of common/rules against ``torch.mean(G, 0)``.

For every (n, d) one random (n, d) float32 matrix is built.  Each rule is called once
to warm up (numba compiles at first use; "first s" in the table), then ``torch.mean(G, 0)``
and the rule are each timed ``--repeat`` times, one after the other; the table shows the
rule's median time and its ratio to the median of ``torch.mean`` just measured.
torch runs with its default thread count (printed in the header); the rule kernels
split large inputs over the same number of threads.  The pre-aggregators of
``common/learn/rules/pre`` (``--pre``) are timed alone, as rows ``pre:NAME``: the time one adds
in front of any rule.

    PYTHONPATH=. python scripts/bench_rules.py --n 20 --d 1000000
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import click
import numba
import torch

from common.learn.rules import RuleError, make_rule, rule_names
from common.learn.rules.pre import Chain, RoundContext, pre_names

PRE = "pre:"  # the prefix of a pre-aggregator's row


def default_q(name: str, n: int) -> int:
    """The paper's setting: the largest q Krum allows (q = 8 for n = 20), capped per rule."""
    q = max((n - 3) // 2, 0)
    if name in ("meamed", "trimmed-mean", "mda", "smea", "caf") or name.startswith(PRE):
        return min(q, (n + 1) // 2 - 1)
    if name == "bulyan":
        return max((n - 3) // 4, 0)
    return q


def timings(fn: Callable[[], object], repeat: int) -> list[float]:
    """Wall-clock seconds of ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def make_step(name: str, n: int, q: int) -> Callable[[torch.Tensor], object]:
    """Rule ``name``, or pre-aggregator ``pre:NAME`` alone (as a one-step chain)."""
    if not name.startswith(PRE):
        return make_rule(name, n, q)
    chain = Chain((name[len(PRE):],), n, q, {})
    context = RoundContext(seed=0, round=0, shard=0)
    return lambda G: chain(G, context)


@click.command()
@click.option(
    "--n",
    "ns",
    multiple=True,
    type=int,
    default=(10, 20, 50),
    show_default=True,
    help="Number of workers (rows); repeat the option for several.",
)
@click.option(
    "--d",
    "ds",
    multiple=True,
    type=int,
    default=(100_000, 1_000_000),
    show_default=True,
    help="Number of coordinates (columns); repeat the option for several.",
)
@click.option("--repeat", type=click.IntRange(min=1), default=5, show_default=True,
              help="Timed calls per rule (fewer for slow rules, see --budget).")
@click.option(
    "--rules", default="all", show_default=True, help="Comma-separated rule names, or 'all'."
)
@click.option(
    "--q",
    type=click.IntRange(min=0),
    default=None,
    help="q for every rule [default: per rule, the largest q Krum allows "
    "(8 for n=20), capped by the rule's own precondition].",
)
@click.option(
    "--pre", "pres", default="all", show_default=True,
    help="Comma-separated pre-aggregators timed alone, 'all', or 'none'.",
)
@click.option("--budget", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="Seconds per rule and (n, d): slow rules get fewer timed calls.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the results as JSON to this file.",
)
def main(
    ns: tuple[int, ...],
    ds: tuple[int, ...],
    repeat: int,
    rules: str,
    pres: str,
    q: int | None,
    budget: float,
    seed: int,
    json_path: Path | None,
) -> None:
    """Time every rule against torch.mean over the same (n, d) matrix."""
    names = rule_names() if rules == "all" else [r.strip() for r in rules.split(",") if r.strip()]
    unknown = sorted(set(names) - set(rule_names()))
    if unknown:
        raise click.BadParameter(f"unknown rule(s) {unknown}; valid: {rule_names()}")
    chosen = (pre_names() if pres == "all" else
              [] if pres == "none" else [p.strip() for p in pres.split(",") if p.strip()])
    unknown = sorted(set(chosen) - set(pre_names()))
    if unknown:
        raise click.BadParameter(f"unknown pre-aggregator(s) {unknown}; valid: {pre_names()}")
    names = names + [PRE + p for p in chosen]
    header = {
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "numba": numba.__version__,
        "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "repeat": repeat,
    }
    click.echo(
        f"torch {header['torch']}, torch.get_num_threads() = {header['torch_threads']}, "
        f"numba {header['numba']}, {header['cpus']} CPUs, {header['machine']}; "
        f"median of up to {repeat} calls"
    )
    click.echo(
        f"{'rule':<19}{'n':>4}{'q':>4}{'d':>10}{'median ms':>12}{'mean ms':>10}"
        f"{'x mean':>9}{'calls':>7}{'first s':>9}"
    )
    rows = []
    generator = torch.Generator().manual_seed(seed)
    for n in ns:
        for d in ds:
            G = torch.randn(n, d, generator=generator)
            torch.mean(G, 0)
            for name in names:
                rule_q = default_q(name, n) if q is None else q
                try:
                    rule = make_step(name, n, rule_q)
                except RuleError as exc:
                    click.echo(f"{name:<19}{n:>4}{rule_q:>4}{d:>10}  skipped: {exc}")
                    continue
                start = time.perf_counter()
                rule(G)  # warm-up: numba compiles (or loads its on-disk cache) here
                first = time.perf_counter() - start
                calls = max(1, min(repeat, int(budget / max(first, 1e-9))))
                mean_ms = statistics.median(timings(lambda G=G: torch.mean(G, 0), calls)) * 1e3
                times = [t * 1e3 for t in timings(lambda rule=rule, G=G: rule(G), calls)]
                med = statistics.median(times)
                rows.append(
                    {
                        "rule": name,
                        "n": n,
                        "q": rule_q,
                        "d": d,
                        "median_ms": med,
                        "mean_ms": mean_ms,
                        "ratio_to_mean": med / mean_ms,
                        "calls": calls,
                        "first_call_s": first,
                        "times_ms": times,
                    }
                )
                click.echo(
                    f"{name:<19}{n:>4}{rule_q:>4}{d:>10}{med:>12.2f}{mean_ms:>10.2f}"
                    f"{med / mean_ms:>9.2f}{calls:>7}{first:>9.2f}"
                )
    if json_path is not None:
        json_path.write_text(json.dumps({"header": header, "rows": rows}, indent=2) + "\n")
        click.echo(f"wrote {json_path}")


if __name__ == "__main__":
    main()
