"""A whole cluster as local processes: S servers, proxies, n workers, the evaluator.

Servers bind free loopback ports (``tcp://HOST:*``) and write the endpoint
they got to a ready file; the launcher waits for those files (with a
deadline, watching that nobody died), starts the proxies the same way, then
the workers and the evaluator. While the run goes it shows the round, the
rounds per second and the latest accuracy; it stops everything on Ctrl-C or
as soon as one process fails, naming it with its last log lines. Logs and
metrics stay in the output directory.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from common.config import AttackConfig, RunConfig
from common.errors import ClusterTimeout, PSError
from common.keys import SecurityOptions, create_keys
from common.metrics import read_jsonl
from common.process import ProcessOptions, check_stop
from common.settings import EVALUATOR, PROXY, SERVER, WORKER, to_argv
from ps.launcher.options import ClusterOptions
from ps.launcher.processes import ManagedProcess, stop_all
from ps.proxy.options import ProxyOptions
from server.checkpoint import final_parameters, params_digest
from server.options import ServerOptions
from worker.options import ClientOptions, EvalOptions

log = logging.getLogger("ps.cluster")

READY_TIMEOUT_S = 180.0
WATCH_INTERVAL_S = 0.5
CHILD_ENV = {
    # one compute thread per process: many processes share few cores
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
}


class ProcessFailed(PSError):
    """A process of the cluster exited with an error."""

    def __init__(self, name: str, code: int, tail: list[str]) -> None:
        lines = "\n".join(f"    {line}" for line in tail)
        super().__init__(f"{name} exited with code {code}; its last log lines:\n{lines}")
        self.exit_code = code if code > 0 else 1
        self.name = name


@dataclass
class ClusterSpec:
    """Everything the launcher needs to start one run (each part a settings dataclass)."""

    cfg: RunConfig
    attack: AttackConfig
    out_dir: Path
    client: ClientOptions = field(default_factory=ClientOptions)
    evaluation: EvalOptions = field(default_factory=EvalOptions)
    cluster: ClusterOptions = field(default_factory=ClusterOptions)
    server: ServerOptions = field(default_factory=ServerOptions)
    process: ProcessOptions = field(default_factory=ProcessOptions)
    security: SecurityOptions = field(default_factory=SecurityOptions)


def child_argv(role: str, *settings: Any) -> list[str]:
    """The flags that hand a ``role`` process every setting of ``settings`` it takes."""
    return [flag for instance in settings for flag in to_argv(instance, role)]


@dataclass
class Progress:
    """What the launcher knows about the run so far (from the metrics files)."""

    round: int = 0
    rounds_per_s: float = 0.0
    eval_round: int | None = None
    top1: float | None = None
    top3: float | None = None
    loss: float | None = None


@dataclass
class ClusterResult:
    """Outcome of a finished cluster run."""

    out_dir: Path
    seconds: float
    progress: Progress
    params: np.ndarray
    digest: str
    evaluations: list[dict] = field(default_factory=list)


class Cluster:
    """Starts, watches and stops the processes of one run."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.out = spec.out_dir
        self.run_dir = self.out / "run"
        self.logs = self.out / "logs"
        self.processes: list[ManagedProcess] = []
        self.started = 0.0
        self.security = spec.security

    # -- lifecycle ---------------------------------------------------------------

    def run(self, on_progress: Callable[[Progress], None] | None = None) -> ClusterResult:
        """Start everything, wait for the run to finish, return the result; always clean up."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        (self.out / "config.json").write_text(
            json.dumps({"run": self.spec.cfg.to_dict(), "attack": self.spec.attack.to_dict()},
                       indent=2) + "\n", encoding="utf-8")
        self.started = time.monotonic()
        self.security = self._keys()
        try:
            servers = self._start_servers()
            fronts = self._start_proxies(servers)
            self._start_workers(fronts)
            if not self.spec.cluster.no_evaluator:
                self._start_evaluator(servers)
            self._watch(on_progress)
        finally:
            stop_all(self.processes)
        return self._result()

    def _keys(self) -> SecurityOptions:
        """What the children use: the given keys, none (--insecure), or keys generated
        for this run in ``<out-dir>/keys`` (a proxy key only for the shards fronted)."""
        given = self.spec.security
        if given.insecure or given.keys is not None:
            return given
        attack, cfg = self.spec.attack, self.spec.cfg
        proxies = attack.proxy_shards if attack.proxy_attack != "none" else ()
        directory = self.out / "keys"
        create_keys(directory, cfg.num_shards, cfg.num_workers, proxies, force=True)
        return SecurityOptions(keys=directory)

    def _child(self, name: str, module: str, args: list[str]) -> ManagedProcess:
        process = ManagedProcess(
            name=name,
            argv=[sys.executable, "-m", module, *args],
            log_path=self.logs / f"{name}.log",
            env=CHILD_ENV,
        )
        process.start()
        self.processes.append(process)
        return process

    def _process(self, ready_file: Path | None = None) -> ProcessOptions:
        return replace(self.spec.process, out_dir=self.out, ready_file=ready_file)

    def server_argv(self, shard: int, ready_file: Path) -> list[str]:
        options = replace(self.spec.server, shard=shard, bind=f"tcp://{self.spec.cluster.host}:*")
        return child_argv(SERVER, options, self.spec.cfg, self.security,
                          self._process(ready_file))

    def proxy_argv(self, shard: int, server: str, ready_file: Path) -> list[str]:
        attack = self.spec.attack
        options = ProxyOptions(bind=f"tcp://{self.spec.cluster.host}:*", server=server,
                               shard=shard)
        return child_argv(PROXY, options, attack, *attack.active(attack.proxy_attack),
                          self.spec.cfg, self.security, self._process(ready_file))

    def worker_argv(self, worker: int, endpoints: list[str]) -> list[str]:
        attack = self.spec.attack
        client = replace(self.spec.client, servers=",".join(endpoints), worker_id=worker)
        lies = (attack, *attack.active(attack.worker_attack)) if attack.is_byzantine(worker) else ()
        return child_argv(WORKER, client, *lies, self.spec.cfg, self.security, self._process())

    def evaluator_argv(self, servers: list[str]) -> list[str]:
        client = replace(self.spec.client, servers=",".join(servers), evaluate=True)
        return child_argv(EVALUATOR, client, self.spec.evaluation, self.spec.cfg,
                          self.security, self._process())

    def _start_servers(self) -> list[str]:
        ready = []
        for s in range(self.spec.cfg.num_shards):
            ready_file = self.run_dir / f"server-{s}.endpoint"
            ready_file.unlink(missing_ok=True)
            self._child(f"server-{s}", "server.cli", self.server_argv(s, ready_file))
            ready.append(ready_file)
        return self._await_endpoints(ready)

    def _start_proxies(self, servers: list[str]) -> list[str]:
        """Endpoints the workers use: the proxy's for fronted shards, else the server's."""
        attack = self.spec.attack
        fronts = list(servers)
        if attack.proxy_attack == "none":
            return fronts
        ready = {}
        for s in attack.proxy_shards:
            ready_file = self.run_dir / f"proxy-{s}.endpoint"
            ready_file.unlink(missing_ok=True)
            self._child(f"proxy-{s}", "ps.proxy.cli", self.proxy_argv(s, servers[s], ready_file))
            ready[s] = ready_file
        for s, endpoint in zip(ready, self._await_endpoints(list(ready.values())), strict=True):
            fronts[s] = endpoint
        return fronts

    def _start_workers(self, endpoints: list[str]) -> None:
        for i in range(self.spec.cfg.num_workers):
            self._child(f"worker-{i}", "worker.cli", self.worker_argv(i, endpoints))

    def _start_evaluator(self, servers: list[str]) -> None:
        self._child("evaluator", "worker.cli", self.evaluator_argv(servers))

    # -- waiting -----------------------------------------------------------------

    def _await_endpoints(self, ready_files: list[Path]) -> list[str]:
        """Wait (deadline ``READY_TIMEOUT_S``) until every ready file names an endpoint."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            check_stop()
            self._raise_if_failed()
            if all(f.exists() for f in ready_files):
                return [f.read_text(encoding="utf-8").strip() for f in ready_files]
            if time.monotonic() > deadline:
                missing = [f.name for f in ready_files if not f.exists()]
                raise ClusterTimeout(f"not ready after {READY_TIMEOUT_S:g} s: {missing}")
            time.sleep(0.05)

    def _watch(self, on_progress: Callable[[Progress], None] | None) -> None:
        """Until every process exited 0; raise at the first failure or the run deadline."""
        limit = self.spec.cluster.run_timeout_s
        while True:
            check_stop()
            self._raise_if_failed()
            if all(p.returncode == 0 for p in self.processes):
                return
            if limit is not None and time.monotonic() - self.started > limit:
                raise ClusterTimeout(
                    f"the run did not finish within {limit:g} s; still running: "
                    + ", ".join(p.name for p in self.processes if p.running)
                )
            if on_progress is not None:
                on_progress(self.progress())
            time.sleep(WATCH_INTERVAL_S)

    def _raise_if_failed(self) -> None:
        for p in self.processes:
            code = p.returncode
            if code not in (None, 0):
                raise ProcessFailed(p.name, code, p.tail())

    # -- results -----------------------------------------------------------------

    def progress(self) -> Progress:
        """Current progress read from server 0's and the evaluator's metrics."""
        rounds = read_jsonl(self.out / "server-0.jsonl")
        progress = Progress()
        if rounds:
            progress.round = rounds[-1]["round"] + 1
            if len(rounds) > 1:
                span = rounds[-1]["time"] - rounds[0]["time"]
                progress.rounds_per_s = (len(rounds) - 1) / span if span > 0 else 0.0
        evals = read_jsonl(self.out / "evaluator.jsonl")
        if evals:
            last = evals[-1]
            progress.eval_round = last["round"]
            progress.top1, progress.top3, progress.loss = last["top1"], last["top3"], last["loss"]
        return progress

    def _result(self) -> ClusterResult:
        params = final_parameters(self.out, self.spec.cfg.num_shards)
        result = ClusterResult(
            out_dir=self.out,
            seconds=time.monotonic() - self.started,
            progress=self.progress(),
            params=params,
            digest=params_digest(params),
            evaluations=read_jsonl(self.out / "evaluator.jsonl"),
        )
        summary = {
            "seconds": result.seconds,
            "rounds": self.spec.cfg.rounds,
            "rounds_per_s": result.progress.rounds_per_s,
            "final_top1": result.progress.top1,
            "final_top3": result.progress.top3,
            "final_loss": result.progress.loss,
            "params_sha256": result.digest,
            "params_finite": bool(np.isfinite(params).all()),
        }
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n",
                                               encoding="utf-8")
        return result
