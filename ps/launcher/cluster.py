"""A whole cluster as local processes: S servers, proxies, n workers, the evaluator.

Servers bind free loopback ports (``tcp://HOST:*``) and write the endpoint
they got to a ready file; the launcher waits for those files (with a
deadline, watching that nobody died), starts the proxies the same way, then
the workers and the evaluator. While the run goes it shows the round, the
rounds per second and the latest accuracy.

It supervises: a process that dies unexpectedly (killed, crashed; not a configuration
error) is started again with the same settings, up to ``--max-restarts`` times each: a
server on the same endpoint with ``--resume`` from its checkpoint (the workers replay
what it lost), a proxy on the same endpoint, a worker that rejoins at the servers'
round. Past that, or on Ctrl-C, it stops everything, naming the process with its last
log lines. Children get SIGTERM if the launcher itself dies, so servers save their
checkpoints and ``ps-cluster --resume OUT_DIR`` can continue the run. Whatever the end,
``summary.json`` says how it ended and why; logs and metrics stay in the output
directory.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from common.config import AttackConfig, RunConfig, write_run_config
from common.errors import (
    EXIT_CONFIG,
    EXIT_INTERRUPTED,
    EXIT_PEER,
    EXIT_TIMEOUT,
    ClusterTimeout,
    ConfigError,
    PSError,
)
from common.keys import SecurityOptions, create_keys
from common.metrics import read_jsonl
from common.process import ProcessOptions, check_stop
from common.settings import CLUSTER, EVALUATOR, PROXY, SERVER, WORKER
from ps.launcher.argv import child_argv
from ps.launcher.forked import ForkedProcess, prepare
from ps.launcher.options import ClusterOptions
from ps.launcher.processes import ManagedProcess, stop_all
from ps.proxy.options import ProxyOptions
from server.checkpoint import final_parameters, params_digest
from server.options import ServerOptions, check_replayable
from worker.options import ClientOptions, EvalOptions

log = logging.getLogger("ps.cluster")

READY_TIMEOUT_S = 180.0
COMMAND_FILE = "command.json"  # the run's ps-cluster flags, for --resume
WATCH_INTERVAL_S = 0.5
CHILD_ENV = {
    # one compute thread per process: many processes share few cores
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
}


class ProcessFailed(PSError):
    """A process of the cluster failed for good: its exit code if a documented one
    (2 configuration, 3 peer, 4 timeout), else 3 (it crashed or was killed)."""

    def __init__(self, name: str, code: int, tail: list[str], restarts: int = 0) -> None:
        lines = "\n".join(f"    {line}" for line in tail)
        again = f" (after {restarts} restarts)" if restarts else ""
        self.reason = f"{name} exited with code {code}{again}"
        super().__init__(f"{self.reason}; its last log lines:\n{lines}")
        self.exit_code = code if code in (EXIT_CONFIG, EXIT_PEER, EXIT_TIMEOUT) else EXIT_PEER
        self.name = name


def restartable(code: int) -> bool:
    """A process that ended with ``code`` may succeed if started again: it was killed or
    crashed, not refused its settings (those would be refused again)."""
    return code not in (0, EXIT_CONFIG)


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


@dataclass
class Progress:
    """What the launcher knows about the run so far (from the metrics files)."""

    round: int = 0
    rounds_per_s: float = 0.0  # timed_rounds / span_s
    timed_rounds: int = 0  # rounds ended after server 0's first one (start-up excluded)
    span_s: float = 0.0  # from the end of that first round to the end of the last
    restarts: int = 0
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
        self.endpoints: dict[str, str] = {}  # where each server and proxy listens
        self.modules: dict[str, str] = {}
        self.restarts: list[dict[str, Any]] = []
        self.lost: list[str] = []  # workers given up on; the quorum goes on without them
        self.startup: dict[str, Any] = {}  # where the start-up time went (summary.json)

    # -- lifecycle ---------------------------------------------------------------

    def run(self, on_progress: Callable[[Progress], None] | None = None) -> ClusterResult:
        """Start everything, supervise until the run finishes, return the result; always
        clean up and write ``summary.json``."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        write_run_config(self.out, self.spec.cfg, self.spec.attack)
        (self.out / COMMAND_FILE).write_text(json.dumps(self.command_argv()) + "\n",
                                             encoding="utf-8")
        self.started = time.monotonic()
        launched = time.time()
        try:
            check_launchable(self.spec)
            self.security = self._keys()
            if self.spec.cluster.start == "fork":
                self.startup["prepare"] = prepare(
                    self.spec.cfg, self.spec.client.data_dir,
                    self.spec.process.torch_threads).as_dict()
            servers = self._start_servers()
            self.startup["servers_ready_s"] = round(time.time() - launched, 3)
            fronts = self._start_proxies(servers)
            self._start_workers(fronts)
            if not self.spec.cluster.no_evaluator:
                self._start_evaluator(servers)
            self.startup["all_started_s"] = round(time.time() - launched, 3)
            self.startup["launched_at"] = launched
            self._watch(on_progress)
            stop_all(self.processes)
            return self._result()
        except BaseException as exc:
            stop_all(self.processes)
            interrupted = isinstance(exc, KeyboardInterrupt)
            self._write_summary(_outcome(exc),
                                reason=getattr(exc, "reason", str(exc).split("\n")[0]),
                                exit_code=EXIT_INTERRUPTED if interrupted
                                else getattr(exc, "exit_code", EXIT_PEER))
            raise

    def _keys(self) -> SecurityOptions:
        """What the children use: the given keys, none (--insecure), or keys generated
        for this run in ``<out-dir>/keys`` (a proxy key only for the shards fronted; a
        resumed run is given the keys it had, ``resumable_spec``)."""
        given = self.spec.security
        if given.insecure or given.keys is not None:
            return given
        attack, cfg = self.spec.attack, self.spec.cfg
        proxies = attack.proxy_shards if attack.proxy_attack != "none" else ()
        directory = self.out / "keys"
        create_keys(directory, cfg.num_shards, cfg.num_workers, proxies, force=True)
        return SecurityOptions(keys=directory)

    def _child(self, name: str, module: str, args: list[str]) -> ManagedProcess:
        process = self._new_process(name, module, args, self.logs / f"{name}.log")
        process.start()
        self.processes.append(process)
        self.modules[name] = module
        return process

    def _restart(self, index: int, code: int) -> None:
        """Start process ``index`` again (it exited with ``code``), on its old endpoint."""
        old = self.processes[index]
        role, _, number = old.name.partition("-")
        if role == "server":
            args = self.server_argv(int(number), None, bind=self.endpoints[old.name],
                                    resume=True)
        elif role == "proxy":
            shard = int(number)
            args = self.proxy_argv(shard, self.endpoints[f"server-{shard}"], None,
                                   bind=self.endpoints[old.name])
        elif role == "worker":
            args = self.worker_argv(int(number), self._fronts())
        else:
            args = self.evaluator_argv([self.endpoints[f"server-{s}"]
                                        for s in range(self.spec.cfg.num_shards)])
        process = self._new_process(old.name, self.modules[old.name], args, old.log_path)
        process.start()
        self.processes[index] = process
        seconds = round(time.monotonic() - self.started, 1)
        self.restarts.append({"process": old.name, "exit_code": code, "after_s": seconds})
        log.warning("%s exited with code %d; restarted it (restart %d of %d)", old.name, code,
                    self._restarts_of(old.name), self.spec.cluster.max_restarts)

    def _new_process(self, name: str, module: str, args: list[str],
                     log_path: Path) -> ManagedProcess:
        """A child running ``python -m module args``: forked from this prepared process
        (``--start fork``) or a fresh interpreter (``--start exec``)."""
        kind = ForkedProcess if self.spec.cluster.start == "fork" else ManagedProcess
        return kind(name=name, argv=[sys.executable, "-m", module, *args],
                    log_path=log_path, env=CHILD_ENV)

    def _restarts_of(self, name: str) -> int:
        return sum(r["process"] == name for r in self.restarts)

    def _fronts(self) -> list[str]:
        """The endpoint of each shard that workers use (its proxy's, if it has one)."""
        return [self.endpoints.get(f"proxy-{s}", self.endpoints[f"server-{s}"])
                for s in range(self.spec.cfg.num_shards)]

    def _process(self, name: str, ready_file: Path | None = None) -> ProcessOptions:
        """Process ``name``'s settings: the run's output directory, its ready file, and
        its log file (rotated; its stdout and stderr go there too, for a crash)."""
        return replace(self.spec.process, out_dir=self.out, ready_file=ready_file,
                       log_file=self.logs / f"{name}.log")

    def command_argv(self) -> list[str]:
        """The ``ps-cluster`` flags that start this run again (what ``--resume`` reads)."""
        spec, attack = self.spec, self.spec.attack
        return child_argv(CLUSTER, spec.cfg, attack, *attack.params.values(), spec.client,
                          spec.evaluation, replace(spec.cluster, resume=None),
                          replace(spec.server, resume=False), spec.security, spec.process)

    def server_argv(self, shard: int, ready_file: Path | None, bind: str | None = None,
                    resume: bool = False) -> list[str]:
        options = replace(self.spec.server, shard=shard,
                          bind=bind or f"tcp://{self.spec.cluster.host}:*",
                          resume=resume or self.spec.server.resume)
        return child_argv(SERVER, options, self.spec.cfg, self.security,
                          self._process(f"server-{shard}", ready_file))

    def proxy_argv(self, shard: int, server: str, ready_file: Path | None,
                   bind: str | None = None) -> list[str]:
        attack = self.spec.attack
        options = ProxyOptions(bind=bind or f"tcp://{self.spec.cluster.host}:*", server=server,
                               shard=shard)
        return child_argv(PROXY, options, attack, *attack.active(attack.proxy_attack),
                          self.spec.cfg, self.security,
                          self._process(f"proxy-{shard}", ready_file))

    def worker_argv(self, worker: int, endpoints: list[str]) -> list[str]:
        attack = self.spec.attack
        client = replace(self.spec.client, servers=",".join(endpoints), worker_id=worker)
        lies = (attack, *attack.active(attack.worker_attack)) if attack.is_byzantine(worker) else ()
        return child_argv(WORKER, client, *lies, self.spec.cfg, self.security,
                          self._process(f"worker-{worker}"))

    def evaluator_argv(self, servers: list[str]) -> list[str]:
        client = replace(self.spec.client, servers=",".join(servers), evaluate=True)
        return child_argv(EVALUATOR, client, self.spec.evaluation, self.spec.cfg,
                          self.security, self._process("evaluator"))

    def _start_servers(self) -> list[str]:
        ready = []
        for s in range(self.spec.cfg.num_shards):
            ready_file = self.run_dir / f"server-{s}.endpoint"
            ready_file.unlink(missing_ok=True)
            self._child(f"server-{s}", "server.cli", self.server_argv(s, ready_file))
            ready.append(ready_file)
        endpoints = self._await_endpoints(ready)
        self.endpoints.update({f"server-{s}": e for s, e in enumerate(endpoints)})
        return endpoints

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
            self.endpoints[f"proxy-{s}"] = endpoint
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
        """Until every process exited 0, restarting those that died (within their
        restarts); raise when one failed for good, or at the run deadline."""
        limit = self.spec.cluster.run_timeout_s
        while True:
            check_stop()
            self._supervise()
            if all(p.returncode == 0 or p.name in self.lost for p in self.processes):
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

    def _supervise(self) -> None:
        """Restart each process that died and may be restarted; raise for one that may not."""
        for index, p in enumerate(self.processes):
            code = p.returncode
            if code in (None, 0) or p.name in self.lost:
                continue
            if restartable(code) and self._restarts_of(p.name) < self.spec.cluster.max_restarts:
                self._restart(index, code)
            elif self._can_lose(p.name, code):
                self.lost.append(p.name)
                log.warning("%s exited with code %d and is not restarted; the rounds go on "
                            "without it (quorum %d)", p.name, code, self._quorum())
            else:
                raise ProcessFailed(p.name, code, p.tail(), self._restarts_of(p.name))

    def _quorum(self) -> int:
        return self.spec.server.rows_needed(self.spec.cfg)

    def _can_lose(self, name: str, code: int) -> bool:
        """Worker ``name`` died for good and the servers' quorum does without it."""
        spare = self.spec.cfg.num_workers - self._quorum()
        lost_workers = sum(n.startswith("worker-") for n in self.lost)
        return name.startswith("worker-") and restartable(code) and lost_workers < spare

    # -- results -----------------------------------------------------------------

    def progress(self) -> Progress:
        """Current progress read from server 0's and the evaluator's metrics."""
        rounds = read_jsonl(self.out / "server-0.jsonl")
        progress = Progress(restarts=len(self.restarts))
        if rounds:
            progress.round = rounds[-1]["round"] + 1
            if len(rounds) > 1:
                span = rounds[-1]["time"] - rounds[0]["time"]
                progress.timed_rounds, progress.span_s = len(rounds) - 1, span
                progress.rounds_per_s = (len(rounds) - 1) / span if span > 0 else 0.0
        evals = read_jsonl(self.out / "evaluator.jsonl")
        if evals:
            last = evals[-1]
            progress.eval_round = last["round"]
            progress.top1, progress.top3, progress.loss = last["top1"], last["top3"], last["loss"]
        return progress

    def _result(self) -> ClusterResult:
        # each shard's checkpoint, checked with its server's key (unkeyed: --insecure)
        params = final_parameters(self.out, self.spec.cfg, self.security.ring("ps-cluster"))
        result = ClusterResult(
            out_dir=self.out,
            seconds=time.monotonic() - self.started,
            progress=self.progress(),
            params=params,
            digest=params_digest(params),
            evaluations=read_jsonl(self.out / "evaluator.jsonl"),
        )
        self._write_summary("finished", reason="", exit_code=0, **{
            "rounds_per_s": result.progress.rounds_per_s,
            "final_top1": result.progress.top1,
            "final_top3": result.progress.top3,
            "final_loss": result.progress.loss,
            "params_sha256": result.digest,
            "params_finite": bool(np.isfinite(params).all()),
        })
        return result

    def _write_summary(self, outcome: str, reason: str, exit_code: int,
                       **extra: Any) -> None:
        """``summary.json``: how the run ended and why, its restarts and figures."""
        closed_short = sum(bool(r.get("missing")) for r in read_jsonl(self.out / "server-0.jsonl"))
        summary = {
            "outcome": outcome,
            "reason": reason,
            "exit_code": exit_code,
            "seconds": round(time.monotonic() - self.started, 2) if self.started else 0.0,
            "rounds": self.spec.cfg.rounds,
            "rounds_done": self.progress().round,
            "restarts": self.restarts,
            "lost": self.lost,
            "rounds_closed_at_deadline_shard0": closed_short,
            "startup": self._startup_figures(),
            **extra,
        }
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n",
                                               encoding="utf-8")


    def _startup_figures(self) -> dict[str, Any]:
        """Seconds from the start of :meth:`run` to each start-up step (``prepare``: the
        fork launcher's imports, kernels, dataset) and to the end of round 0."""
        figures = {k: v for k, v in self.startup.items() if k != "launched_at"}
        rounds = read_jsonl(self.out / "server-0.jsonl")
        if rounds and "launched_at" in self.startup:
            figures["round0_done_s"] = round(rounds[0]["time"] - self.startup["launched_at"], 3)
        return figures


def _outcome(exc: BaseException) -> str:
    """A word for how a run that raised ``exc`` ended."""
    from common.errors import Interrupted

    if isinstance(exc, (Interrupted, KeyboardInterrupt)):
        return "interrupted"
    if isinstance(exc, ClusterTimeout):
        return "timeout"
    if isinstance(exc, ConfigError):
        return "configuration-error"
    return "failed"


def check_launchable(spec: ClusterSpec) -> None:
    """``ConfigError`` for settings the processes would refuse, before starting any."""
    spec.server.check(spec.cfg)
    if spec.cluster.max_restarts > 0:
        check_replayable(spec.server.checkpoint_every, spec.client.replay_rounds)
    attack = spec.attack
    if spec.server.round_timeout_s is not None and attack.proxy_holds_rounds:
        raise ConfigError(f"--round-timeout: the proxy attack {attack.proxy_attack} holds "
                          "each round until all n pushes are in, which a round closed "
                          "without some workers never has; use a value-level proxy "
                          "attack (gambler, bitflip) or a worker attack")


def resumable_spec(spec: ClusterSpec) -> ClusterSpec:
    """The spec that continues the run in ``spec.cluster.resume``: its own settings,
    its servers resuming from their checkpoints; ``ConfigError`` if it cannot.

    A run whose keys the launcher generated (``<out-dir>/keys``) continues with those
    keys, not new ones: its servers resume only checkpoints tagged with their own key.
    Each checkpoint is checked here as its server will check it (``CheckpointError``
    naming the file), its size too: the shard's, counted from the run's model."""
    from server.checkpoint import checkpoint_path, read_run_checkpoint

    out = spec.out_dir
    cfg = spec.cfg
    present = [s for s in range(cfg.num_shards) if os.path.lexists(checkpoint_path(out, s))]
    security = spec.security
    if not security.insecure and security.keys is None and (present or (out / "keys").is_dir()):
        if not (out / "keys").is_dir():
            raise ConfigError(f"cannot resume {out} with keys: it holds checkpoints but no "
                              f"key directory (was it run with --insecure? then resume it "
                              f"with --insecure; its checkpoints carry no key)")
        security = replace(security, keys=out / "keys")
    keys = security.ring("ps-cluster --resume") if present else None
    rounds = {s: read_run_checkpoint(out, cfg, s, keys, finite=True).round
              if s in present else 0 for s in range(cfg.num_shards)}
    if max(rounds.values()) - min(rounds.values()) > 1:
        raise ConfigError(f"cannot resume {out}: the shards' checkpoints are at rounds "
                          f"{rounds}, more than one round apart (the servers were not stopped "
                          f"cleanly, and the workers' gradients of the rounds between are gone)")
    if min(rounds.values()) >= cfg.rounds:
        raise ConfigError(f"nothing to resume: the run in {out} finished all {cfg.rounds} "
                          f"rounds")
    log.info("resuming %s from checkpoints at rounds %s", out, rounds)
    return replace(spec, server=replace(spec.server, resume=True), security=security,
                   cluster=replace(spec.cluster, resume=None))


class BackgroundRun:
    """A cluster run in a thread of this process, for scripts that act on the run while
    it goes (kill a process, attack a node): ``cluster.processes`` name the children;
    :meth:`join` gives the result, or the exception the run ended with."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._outcome: ClusterResult | BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="cluster")
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def process(self, name: str) -> ManagedProcess | None:
        """The running child called ``name`` (``worker-3``), if any."""
        found = next((p for p in self.cluster.processes if p.name == name), None)
        return found if found is not None and found.running else None

    def join(self) -> ClusterResult | BaseException:
        self._thread.join()
        return self._outcome  # type: ignore[return-value]  (set before the thread ends)

    def _run(self) -> None:
        try:
            self._outcome = self.cluster.run()
        except BaseException as exc:  # handed to join(): the run did not finish
            self._outcome = exc
