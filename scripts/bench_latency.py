"""Rounds per second against added network latency, printed as one table.

A local cluster (default S=4 servers, n=20 workers, 60 rounds, no evaluator, CURVE keys)
runs once per one-way latency (default 0, 1, 10 and 50 ms), and once without relays.
The latency comes from ``scripts/delay_relay.py``: one relay per shard, on loopback (not
in network namespaces: on one machine they would add nothing but set-up), between all
workers and that shard's server; it delays every chunk in each direction by the latency,
so a round trip costs twice it. A round needs one round trip per shard, all in parallel
(the push, answered with the next round's parameters), so its floor is one RTT: the
table shows rounds/s, the ratio to the 0 ms relay run, the round time and what the round
takes beyond that floor. If latency only adds its RTT, that last column stays near the
0 ms round time; it grows if a round needs more round trips than one.

Every run has the same settings, so every run must end with the same parameters (checked
and printed).

    python3 scripts/bench_latency.py                          # S=4, n=20, 60 rounds
    python3 scripts/bench_latency.py --rounds 30 --latencies 0,50 --json lat.json
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from common.net.keys import SecurityOptions
from common.run.config import AttackConfig, RunConfig
from ps.launcher.cluster import Cluster, ClusterSpec
from ps.launcher.options import ClusterOptions
from ps.launcher.processes import ManagedProcess, stop_all
from ps.launcher.report import Progress
from worker.options import ClientOptions

RELAY = Path(__file__).resolve().parent / "delay_relay.py"
RELAY_READY_S = 30.0


class RelayedCluster(Cluster):
    """A cluster whose workers reach each shard through a delay relay of its own."""

    def __init__(self, spec: ClusterSpec, delay_ms: float | None, jitter_ms: float) -> None:
        super().__init__(spec)
        self.delay_ms = delay_ms
        self.jitter_ms = jitter_ms
        self.relays: list[ManagedProcess] = []

    def run(self, on_progress: Any = None) -> Any:
        try:
            return super().run(on_progress)
        finally:
            stop_all(self.relays)

    def _start_proxies(self, servers: list[str]) -> list[str]:
        fronts = super()._start_proxies(servers)
        if self.delay_ms is None:
            return fronts
        ready = []
        for s, front in enumerate(fronts):
            ready.append(self.run_dir / f"relay-{s}.ready")
            relay = ManagedProcess(f"relay-{s}", [
                sys.executable, str(RELAY), "--listen", f"{self.spec.cluster.host}:0",
                "--to", front.removeprefix("tcp://"), "--delay-ms", str(self.delay_ms),
                "--jitter-ms", str(self.jitter_ms), "--seed", str(s),
                "--ready-file", str(ready[-1])], self.logs / f"relay-{s}.log")
            relay.start()
            self.relays.append(relay)
        deadline = time.monotonic() + RELAY_READY_S
        while not all(f.exists() for f in ready):
            failed = [r for r in self.relays if r.returncode is not None]
            if failed or time.monotonic() > deadline:
                raise click.ClickException(f"relays not ready: {[r.tail() for r in failed]}")
            time.sleep(0.05)
        return [f"tcp://{f.read_text(encoding='utf-8').strip()}" for f in ready]


@dataclass
class Row:
    """One run: its one-way latency (None: no relay) and what it measured."""

    latency_ms: float | None
    rounds_per_s: float
    wall_s: float
    digest: str

    @property
    def label(self) -> str:
        return "direct (no relay)" if self.latency_ms is None else f"{self.latency_ms:g} ms"

    @property
    def round_ms(self) -> float:
        return 1000 / self.rounds_per_s if self.rounds_per_s else float("inf")

    @property
    def rtt_floor_ms(self) -> float:
        return 2 * (self.latency_ms or 0.0)


def measure(cfg: RunConfig, latency_ms: float | None, jitter_ms: float, start: str,
            insecure: bool, out: Path) -> Row:
    """One run of ``cfg`` with relays of ``latency_ms`` (None: without relays)."""
    spec = ClusterSpec(cfg=cfg, attack=AttackConfig().validate(cfg), out_dir=out,
                       client=ClientOptions(),
                       cluster=ClusterOptions(no_evaluator=True, start=start, max_restarts=0,
                                              run_timeout_s=1800),
                       security=SecurityOptions(insecure=insecure))
    began = time.monotonic()
    result = RelayedCluster(spec, latency_ms, jitter_ms).run()
    progress: Progress = result.progress
    return Row(latency_ms, progress.rounds_per_s, time.monotonic() - began, result.digest)


def print_table(rows: list[Row], cfg: RunConfig) -> None:
    base = next((r for r in rows if r.latency_ms == 0), rows[0])
    click.echo(f"\nS={cfg.num_shards}, n={cfg.num_workers}, {cfg.rounds} rounds, "
               f"{cfg.model} on {cfg.dataset}, rule {cfg.rule}; latency added one way, "
               "each direction, by a loopback delay relay per shard")
    click.echo("| one-way latency | RTT floor | rounds/s | / 0 ms | round time "
               "| round time - RTT floor |")
    click.echo("|---|---|---|---|---|---|")
    for r in rows:
        click.echo(f"| {r.label} | {r.rtt_floor_ms:g} ms | {r.rounds_per_s:.2f} | "
                   f"{r.rounds_per_s / base.rounds_per_s:.2f} | {r.round_ms:.1f} ms | "
                   f"{r.round_ms - r.rtt_floor_ms:.1f} ms |")
    same = len({r.digest for r in rows}) == 1
    click.echo(f"every run ended with the same parameters: {same}")


@click.command(context_settings={"show_default": True})
@click.option("--workers", default=20, type=int)
@click.option("--shards", default=4, type=int)
@click.option("--rounds", default=60, type=int)
@click.option("--latencies", default="0,1,10,50", help="One-way latencies in ms, "
              "comma-separated.")
@click.option("--jitter-ms", default=0.0, type=float, help="Uniform jitter +- this.")
@click.option("--direct/--no-direct", default=True, help="Also a run without relays.")
@click.option("--rule", default="marmed")
@click.option("--model", default="mlp")
@click.option("--dataset", default="synthetic")
@click.option("--start", default="fork", type=click.Choice(["fork", "exec"]))
@click.option("--insecure", is_flag=True, help="Without CURVE keys (default: with).")
@click.option("--json", "json_path", default=None, type=click.Path(path_type=Path),
              help="Also write the rows to this file.")
def main(workers: int, shards: int, rounds: int, latencies: str, jitter_ms: float,
         direct: bool, rule: str, model: str, dataset: str, start: str, insecure: bool,
         json_path: Path | None) -> None:
    cfg = RunConfig(dataset=dataset, model=model, num_workers=workers, num_shards=shards,
                    rule=rule, rounds=rounds).validate()
    plan: list[float | None] = [float(x) for x in latencies.split(",") if x.strip()]
    if direct:
        plan.insert(0, None)
    rows = []
    for latency in plan:
        with tempfile.TemporaryDirectory() as tmp:
            click.echo(f"running {'without relays' if latency is None else f'{latency:g} ms'}"
                       " ...", err=True)
            rows.append(measure(cfg, latency, jitter_ms, start, insecure, Path(tmp) / "run"))
    print_table(rows, cfg)
    if json_path:
        json_path.write_text(json.dumps({
            "config": cfg.to_dict(), "jitter_ms": jitter_ms, "start": start,
            "rows": [asdict(r) | {"round_ms": r.round_ms, "rtt_floor_ms": r.rtt_floor_ms}
                     for r in rows]}, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
