"""Rounds per second of a local multi-process cluster against the in-process reference
engine, for the same configuration, measured in one run.

    python3 scripts/bench_cluster.py --workers 20 --shards 4 --rounds 200
    python3 scripts/bench_cluster.py --security both   # the cost of CURVE, in one run
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import click
import torch

from common.config import AttackConfig, RunConfig
from common.data import load_dataset
from common.keys import SecurityOptions
from ps.launcher.cluster import Cluster, ClusterSpec
from ps.launcher.options import ClusterOptions
from ps.reference.engine import simulate


@click.command(context_settings={"show_default": True})
@click.option("--workers", default=20, type=int)
@click.option("--shards", default=4, type=int)
@click.option("--rule", default="marmed")
@click.option("--dataset", default="fashion-mnist")
@click.option("--rounds", default=200, type=int)
@click.option("--proxy-attack", default="none", help="e.g. gambler (proxy on shard 0)")
@click.option("--security", type=click.Choice(["keys", "insecure", "both"]), default="keys",
              help="CURVE keys (the default of ps-cluster), none, or both one after the other")
@click.option("--json", "json_path", default=None, type=click.Path(path_type=Path))
def main(workers: int, shards: int, rule: str, dataset: str, rounds: int, proxy_attack: str,
         security: str, json_path: Path | None) -> None:
    cfg = RunConfig(dataset=dataset, num_workers=workers, num_shards=shards, rule=rule,
                    rounds=rounds).validate()
    attack = AttackConfig(proxy_attack=proxy_attack).validate(cfg)
    modes = ["keys", "insecure"] if security == "both" else [security]
    runs = {}
    for mode in modes:
        with tempfile.TemporaryDirectory() as tmp:
            spec = ClusterSpec(cfg=cfg, attack=attack, out_dir=Path(tmp),
                               cluster=ClusterOptions(no_evaluator=True),
                               security=SecurityOptions(insecure=mode == "insecure"))
            runs[mode] = Cluster(spec).run()
        click.echo(f"cluster with {mode}: {runs[mode].progress.rounds_per_s:.1f} rounds/s steady")
    if len(runs) == 2:
        ratio = runs["keys"].progress.rounds_per_s / runs["insecure"].progress.rounds_per_s
        click.echo(f"ratio keys/insecure: {ratio:.3f}")
    cluster = runs[modes[0]]
    # steady state: rounds/s from the servers' timestamps, start-up excluded
    cluster_rps = cluster.progress.rounds_per_s
    torch.set_num_threads(1)
    reference = simulate(cfg, attack, dataset=load_dataset(cfg.dataset, seed=cfg.seed))
    reference_rps = rounds / reference.seconds
    same = reference.digest == cluster.digest
    result = {
        "workers": workers, "shards": shards, "rule": rule, "dataset": dataset,
        "rounds": rounds, "proxy_attack": proxy_attack, "security": modes[0],
        **{f"cluster_rounds_per_s_{m}": round(r.progress.rounds_per_s, 2)
           for m, r in runs.items()},
        "cluster_rounds_per_s": round(cluster_rps, 2),
        "cluster_wall_s_with_startup": round(cluster.seconds, 1),
        "reference_rounds_per_s": round(reference_rps, 2),
        "cluster_over_reference": round(cluster_rps / reference_rps, 3),
        "bit_identical": same,
    }
    click.echo(f"cluster ({workers} workers, {shards} servers, {rule}): "
               f"{cluster_rps:.1f} rounds/s steady ({cluster.seconds:.1f} s wall incl. start-up)")
    click.echo(f"reference engine (one process, one thread): {reference_rps:.1f} rounds/s")
    click.echo(f"ratio cluster/reference: {cluster_rps / reference_rps:.2f}; "
               f"final parameters bit-identical: {same}")
    if json_path:
        json_path.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
