"""What connections that never start a handshake cost a server: its CPU (in cores)
while idle and while a client keeps up to ``--connections`` bare TCP connections open
against it from ``--sources`` loopback addresses (opening them again as the server cuts
them), and how many the server held.

A bare connection delivers nothing, so no key is known and no key's budget applies; the
in-flight guard (``common/net/inflight.py``) bounds them per source address and in all and
scans them every few intervals. Printed: cores idle, cores under the flood, cores in the
same time after it (the connections left held and scanned: within the 10 s before an
idle connection is cut), connections opened, and how many were still open at the end.

    python3 scripts/bench_bare.py                       # 10,000 connections, 10 s
    python3 scripts/bench_bare.py --connections 2000 --seconds 5
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

from common.conf.settings import SERVER, to_argv
from common.net.keys import create_keys
from common.run.config import RunConfig
from ps.chaos.keyholders import BareFlood, cpu_s


def _cores(pid: int, seconds: float, during=None) -> float:
    start_cpu, start = cpu_s(pid), time.monotonic()
    while time.monotonic() - start < seconds:
        if during is not None:
            during()
        else:
            time.sleep(0.05)
    return (cpu_s(pid) - start_cpu) / (time.monotonic() - start)


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--connections", default=10_000, help="Bare connections kept open at most.")
@click.option("--sources", default=40, help="Loopback source addresses they come from.")
@click.option("--seconds", default=10.0, help="Length of each measurement.")
@click.option("--reopen/--no-reopen", default=True,
              help="Open a new connection for each one the server cuts (a churn the server "
              "must accept), or open --connections once and keep what is left.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None)
def main(connections: int, sources: int, seconds: float, reopen: bool,
         json_path: Path | None) -> None:
    """Measure a keyed ps-server's CPU idle and under a flood of bare connections."""
    cfg = RunConfig(dataset="synthetic", num_workers=4, num_shards=1, rounds=10).validate()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        create_keys(out / "keys", 1, 4)
        ready = out / "ready"
        server = subprocess.Popen(
            [sys.executable, "-m", "server.cli", "--shard", "0", "--bind",
             "tcp://127.0.0.1:*", "--ready-file", str(ready), "--keys", str(out / "keys"),
             "--out-dir", str(out), "--log-file", str(out / "server.log"),
             *to_argv(cfg, SERVER)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while not (ready.exists() and ready.read_text().strip()):
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the server did not start")
                time.sleep(0.05)
            host, port = ready.read_text().strip().removeprefix("tcp://").rsplit(":", 1)
            time.sleep(1.0)
            idle = _cores(server.pid, seconds)
            flood = BareFlood(host, int(port), connections, sources, reopen)
            try:
                flooded = _cores(server.pid, seconds, flood.step)
                held = _cores(server.pid, seconds)  # what is left, held and scanned
                flood.step()
                still_open = len(flood.open)
            finally:
                flood.close()
            log = (out / "server.log").read_text(errors="replace")
        finally:
            server.terminate()
            server.wait(30)
    result = {"connections": connections, "sources": sources, "seconds": seconds,
              "reopen": reopen,
              "cores_idle": round(idle, 3), "cores_flooded": round(flooded, 3),
              "cores_holding_after": round(held, 3),
              "opened": flood.opened, "open_at_end": still_open,
              "cut_lines_in_log": log.count("cut a connection")}
    print(f"server CPU idle {idle:.3f} cores, under {connections:,} bare connections from "
          f"{sources} sources{' (reopened as cut)' if reopen else ''} {flooded:.3f} cores; "
          f"{flood.opened:,} opened; then {held:.3f} cores holding what was left, "
          f"{still_open:,} still open at the end (the client's view)")
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
