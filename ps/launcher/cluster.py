"""A whole cluster as local processes: the server processes (S shards spread over
``--server-processes``, each process named after its first shard), proxies, n workers,
the evaluator.

Servers bind free loopback ports (``tcp://HOST:*``) and write the endpoint
they got to a ready file; the launcher waits for those files (with a
deadline, watching that nobody died), starts the proxies the same way, then
the workers and the evaluator. ``Cluster`` does that start order and knows how to
start each process again; ``ps.launcher.supervise`` watches the run (restarts, lost
workers, the quorum) and ``ps.launcher.report`` reports it (the progress line's
figures, the result, ``summary.json``).

A process that dies unexpectedly (killed, crashed; not a configuration error) is
started again with the same settings, up to ``--max-restarts`` times each: a server on
the same endpoint with ``--resume`` from its checkpoint (the workers replay what it
lost), a proxy on the same endpoint, a worker that rejoins at the servers' round.
Past that, or on Ctrl-C, it stops everything, naming the process with its last log
lines. Children get SIGTERM if the launcher itself dies, so servers save their
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from common.conf.settings import CLUSTER, EVALUATOR, PROXY, SERVER, WORKER
from common.errors import ClusterTimeout, ConfigError
from common.net.keys import SecurityOptions, create_keys
from common.net.sharding import format_shard_set
from common.run.config import AttackConfig, RunConfig, write_run_config
from common.run.process import ProcessOptions, check_stop
from ps.launcher.argv import child_argv
from ps.launcher.forked import ForkedProcess, prepare
from ps.launcher.options import ClusterOptions
from ps.launcher.processes import ManagedProcess, stop_all
from ps.launcher.report import ClusterResult, Progress, RunReport, read_progress
from ps.launcher.supervise import Supervisor, raise_if_failed
from ps.proxy.options import ProxyOptions
from server.checkpoint import final_parameters, model_size
from server.deadline import AUTO, NONE
from server.options import ServerOptions, check_replayable
from worker.device import spread_device
from worker.options import ClientOptions, EvalOptions

log = logging.getLogger("ps.cluster")

READY_TIMEOUT_S = 180.0
COMMAND_FILE = "command.json"  # the run's ps-cluster flags, for --resume
CHILD_ENV = {
    # one compute thread per process: many processes share few cores
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
}


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

    def __post_init__(self) -> None:
        # the default deadline yields to a proxy attack that holds each round until all n
        # pushes are in (a round closed without some never has them); a fixed one is
        # refused with it (check_launchable)
        if self.attack.proxy_holds_rounds and self.server.round_timeout == AUTO:
            object.__setattr__(self, "server", replace(self.server, round_timeout=NONE))


class Cluster:
    """Starts the processes of one run in order (servers, proxies, workers, the
    evaluator), each with the argv its role takes; its :class:`Supervisor` watches them
    and its :class:`RunReport` reports the run. ``processes``: the children, restarted
    ones in place of those they replace.

    ``workers``: start only these worker ids, one process each (default: all n, in the
    processes of ``--worker-processes``). A test bed: the other workers' keys are held
    by someone else (``ps.chaos``: the attackers', whose workers never run), so the
    servers' quorum must do without them; the supervisor counts the spare workers among
    those started (with a quorum of all of them, none may be lost). ``command.json``
    does not record it: a resumed run starts all n."""

    def __init__(self, spec: ClusterSpec, workers: Iterable[int] | None = None) -> None:
        self.spec = spec
        self.out = spec.out_dir
        self.run_dir = self.out / "run"
        self.logs = self.out / "logs"
        self.processes: list[ManagedProcess] = []
        self.security = spec.security
        self.endpoints: dict[str, str] = {}  # where each server and proxy listens
        self.modules: dict[str, str] = {}
        # the shards of each server process, by its name's number (its first shard)
        self.blocks = {block[0]: block for block in spec.cluster.blocks(spec.cfg.num_shards)}
        # the workers of each worker process, by its name's number (its first worker)
        self.teams = ({team[0]: team
                       for team in spec.cluster.worker_blocks(spec.cfg.num_workers)}
                      if workers is None else started_alone(workers, spec.cfg.num_workers))
        self.supervisor = Supervisor(self.processes, self._respawn, spec.cluster,
                                     quorum=spec.server.rows_needed(spec.cfg),
                                     workers_of=self._workers_of)
        self.report = RunReport(self.out, spec.cfg.rounds)

    # -- lifecycle ---------------------------------------------------------------

    def run(self, on_progress: Callable[[Progress], None] | None = None) -> ClusterResult:
        """Start everything, supervise until the run finishes, return the result; always
        clean up and write ``summary.json``."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        write_run_config(self.out, self.spec.cfg, self.spec.attack)
        (self.out / COMMAND_FILE).write_text(json.dumps(self.command_argv()) + "\n",
                                             encoding="utf-8")
        report, supervisor = self.report, self.supervisor
        report.begin()
        try:
            check_launchable(self.spec)
            self.security = self._keys()
            if self.spec.cluster.start == "fork":
                report.startup["prepare"] = prepare(
                    self.spec.cfg, self.spec.client.data_dir,
                    self.spec.process.torch_threads).as_dict()
            self._write_partition()
            servers = self._start_servers()
            report.mark("servers_ready_s")
            fronts = self._start_proxies()
            self._start_workers(fronts)
            if not self.spec.cluster.no_evaluator:
                self._start_evaluator(servers)
            report.mark("all_started_s")
            supervisor.watch(report.started, None if on_progress is None else
                             lambda: on_progress(self.progress()))
            stop_all(self.processes)
            # each shard's checkpoint, checked with its server's key (unkeyed: --insecure)
            params = final_parameters(self.out, self.spec.cfg, self.security.ring("ps-cluster"),
                                      len(self.blocks))
            return report.finished(params, supervisor.restarts, supervisor.lost,
                                   supervisor.after_end)
        except BaseException as exc:
            stop_all(self.processes)
            report.failed(exc, supervisor.restarts, supervisor.lost)
            raise

    def _write_partition(self) -> None:
        """Compute the workers' partition before any process starts (``ConfigError`` for a
        worker left with less than a batch) and write their class counts,
        ``partition.json``. The dataset is the one :func:`prepare` kept (``--start
        fork``) or is loaded here."""
        from common.learn.data import run_dataset, write_partition

        cfg = self.spec.cfg
        write_partition(self.out, cfg, run_dataset(cfg, self.spec.client.data_dir))

    def progress(self) -> Progress:
        """Current progress read from server 0's and the evaluator's metrics."""
        return read_progress(self.out, len(self.supervisor.restarts))

    def _keys(self) -> SecurityOptions:
        """What the children use: the given keys, none (--insecure), or keys generated
        for this run in ``<out-dir>/keys`` (a proxy key only for the server processes
        fronted; a resumed run is given the keys it had, ``resumable_spec``)."""
        given = self.spec.security
        if given.insecure or given.keys is not None:
            return given
        cfg = self.spec.cfg
        proxies = self._proxied()
        directory = self.out / "keys"
        create_keys(directory, cfg.num_shards, cfg.num_workers, proxies, force=True)
        return SecurityOptions(keys=directory)

    def _child(self, name: str, module: str, args: list[str]) -> ManagedProcess:
        process = self._new_process(name, module, args, self.logs / f"{name}.log")
        process.start()
        self.processes.append(process)
        self.modules[name] = module
        return process

    def _respawn(self, old: ManagedProcess) -> ManagedProcess:
        """Start process ``old`` again with its settings: a server on its endpoint with
        ``--resume``, a proxy on its endpoint, a worker or the evaluator to the same
        endpoints."""
        role, _, number = old.name.partition("-")
        if role == "server":
            args = self.server_argv(int(number), None, bind=self.endpoints[old.name],
                                    resume=True)
        elif role == "proxy":
            first = int(number)
            args = self.proxy_argv(first, self.endpoints[f"server-{first}"], None,
                                   bind=self.endpoints[old.name])
        elif role == "worker":
            args = self.worker_argv(self.teams[int(number)], self._fronts())
        else:
            args = self.evaluator_argv([self.endpoints[f"server-{k}"] for k in self.blocks])
        process = self._new_process(old.name, self.modules[old.name], args, old.log_path)
        process.start()
        return process

    def _workers_of(self, name: str) -> int:
        """How many workers process ``name`` (``worker-<first>``) runs."""
        return len(self.teams.get(int(name.partition("-")[2]), ()))

    def _new_process(self, name: str, module: str, args: list[str],
                     log_path: Path) -> ManagedProcess:
        """A child running ``python -m module args``: forked from this prepared process
        (``--start fork``) or a fresh interpreter (``--start exec``)."""
        kind = ForkedProcess if self.spec.cluster.start == "fork" else ManagedProcess
        return kind(name=name, argv=[sys.executable, "-m", module, *args],
                    log_path=log_path, env=CHILD_ENV)

    def _fronts(self) -> list[str]:
        """The endpoint of each server process that workers use (its proxy's, if it has
        one), in shard order."""
        return [self.endpoints.get(f"proxy-{k}", self.endpoints[f"server-{k}"])
                for k in self.blocks]

    def _proxied(self) -> list[int]:
        """The server processes (by first shard) hosting a shard a proxy corrupts."""
        attack = self.spec.attack
        if attack.proxy_attack == "none":
            return []
        return [k for k, block in self.blocks.items() if set(block) & set(attack.proxy_shards)]

    def _process(self, name: str, ready_file: Path | None = None) -> ProcessOptions:
        """Process ``name``'s settings: the run's output directory, its ready file, and
        its log file (rotated; its stdout and stderr go there too, for a crash)."""
        return replace(self.spec.process, out_dir=self.out, ready_file=ready_file,
                       log_file=self.logs / f"{name}.log")

    def command_argv(self) -> list[str]:
        """The ``ps-cluster`` flags that start this run again (what ``--resume`` reads),
        with the server processes it ran (their keys sign the checkpoints: a resumed run
        must spread the shards the same way, whatever the default where it resumes)."""
        spec, attack = self.spec, self.spec.attack
        cluster = replace(spec.cluster, resume=None, server_processes=len(self.blocks))
        return child_argv(CLUSTER, spec.cfg, attack, *attack.params.values(), spec.client,
                          spec.evaluation, cluster,
                          replace(spec.server, resume=False), self._saved_security(),
                          spec.process)

    def _saved_security(self) -> SecurityOptions:
        """The security settings ``command.json`` records, which a resume's command line
        must repeat (``ps.launcher.cli.resumed_security``): ``--keys`` made absolute
        (a resume may run from another directory), none for the run's own
        ``<out-dir>/keys`` (the default: a resumed run is given it explicitly, and the
        run directory may move)."""
        security = self.spec.security
        if security.keys is None:
            return security
        own = self.out / "keys"
        if os.path.realpath(security.keys) == os.path.realpath(own):
            return replace(security, keys=None)
        return replace(security, keys=Path(os.path.abspath(security.keys)))

    def server_argv(self, first: int, ready_file: Path | None, bind: str | None = None,
                    resume: bool = False) -> list[str]:
        """Server process ``server-<first>``'s flags (its shards: ``--shard 0-4``)."""
        options = replace(self.spec.server, shard=format_shard_set(self.blocks[first]),
                          bind=bind or f"tcp://{self.spec.cluster.host}:*",
                          resume=resume or self.spec.server.resume,
                          await_evaluator=not self.spec.cluster.no_evaluator)
        return child_argv(SERVER, options, self.spec.cfg, self.security,
                          self._process(f"server-{first}", ready_file))

    def proxy_argv(self, first: int, server: str, ready_file: Path | None,
                   bind: str | None = None) -> list[str]:
        """The flags of the proxy in front of server process ``server-<first>`` (it
        corrupts the shards of ``--proxy-shards`` that the process hosts)."""
        attack = self.spec.attack
        options = ProxyOptions(bind=bind or f"tcp://{self.spec.cluster.host}:*", server=server,
                               shard=format_shard_set(self.blocks[first]))
        return child_argv(PROXY, options, attack, *attack.active(attack.proxy_attack),
                          self.spec.cfg, self.security,
                          self._process(f"proxy-{first}", ready_file))

    def worker_argv(self, workers: int | tuple[int, ...], endpoints: list[str]) -> list[str]:
        """The flags of the worker process running ``workers`` (a worker id, or a team of
        ``self.teams``: ``--worker-id 0-9``), named after its first; the worker attack's
        settings if one of them is Byzantine."""
        attack = self.spec.attack
        team = (workers,) if isinstance(workers, int) else workers
        first = team[0]
        place = list(self.teams).index(first) if first in self.teams else first
        client = replace(self.spec.client, servers=",".join(endpoints),
                         worker_id=format_shard_set(team),
                         device=spread_device(self.spec.client.device, place),
                         via_proxy=tuple(self._proxied()))
        lies = ((attack, *attack.active(attack.worker_attack))
                if any(map(attack.is_byzantine, team)) else ())
        return child_argv(WORKER, client, *lies, self.spec.cfg, self.security,
                          self._process(f"worker-{first}"))

    def evaluator_argv(self, servers: list[str]) -> list[str]:
        client = replace(self.spec.client, servers=",".join(servers), evaluate=True)
        return child_argv(EVALUATOR, client, self.spec.evaluation, self.spec.cfg,
                          self.security, self._process("evaluator"))

    def _start_servers(self) -> list[str]:
        ready = []
        for k in self.blocks:
            ready_file = self.run_dir / f"server-{k}.endpoint"
            ready_file.unlink(missing_ok=True)
            self._child(f"server-{k}", "server.cli", self.server_argv(k, ready_file))
            ready.append(ready_file)
        endpoints = self._await_endpoints(ready)
        self.endpoints.update({f"server-{k}": e for k, e in zip(self.blocks, endpoints,
                                                                  strict=True)})
        return endpoints

    def _start_proxies(self) -> list[str]:
        """Endpoints the workers use: the proxy's for fronted server processes, else the
        server's."""
        ready = {}
        for k in self._proxied():
            ready_file = self.run_dir / f"proxy-{k}.endpoint"
            ready_file.unlink(missing_ok=True)
            self._child(f"proxy-{k}", "ps.proxy.cli",
                        self.proxy_argv(k, self.endpoints[f"server-{k}"], ready_file))
            ready[k] = ready_file
        for k, endpoint in zip(ready, self._await_endpoints(list(ready.values())), strict=True):
            self.endpoints[f"proxy-{k}"] = endpoint
        return self._fronts()

    def _start_workers(self, endpoints: list[str]) -> None:
        for first in self.teams:
            self._child(f"worker-{first}", "worker.cli",
                        self.worker_argv(self.teams[first], endpoints))

    def _start_evaluator(self, servers: list[str]) -> None:
        self._child("evaluator", "worker.cli", self.evaluator_argv(servers))

    # -- waiting -----------------------------------------------------------------

    def _await_endpoints(self, ready_files: list[Path]) -> list[str]:
        """Wait (deadline ``READY_TIMEOUT_S``) until every ready file names an endpoint."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            check_stop()
            raise_if_failed(self.processes)
            if all(f.exists() for f in ready_files):
                return [f.read_text(encoding="utf-8").strip() for f in ready_files]
            if time.monotonic() > deadline:
                missing = [f.name for f in ready_files if not f.exists()]
                raise ClusterTimeout(f"not ready after {READY_TIMEOUT_S:g} s: {missing}")
            time.sleep(0.05)


def started_alone(workers: Iterable[int], n: int) -> dict[int, tuple[int, ...]]:
    """The teams of a cluster that starts only ``workers``, one process each;
    ``ConfigError`` for none, a repeated id or one outside 0..n-1."""
    ids = list(workers)
    if not ids or len(set(ids)) != len(ids) or not all(0 <= i < n for i in ids):
        raise ConfigError(f"the workers to start must be distinct ids in 0..{n - 1} "
                          f"(n={n}), at least one: got {ids}")
    return {i: (i,) for i in sorted(ids)}


def check_launchable(spec: ClusterSpec) -> None:
    """``ConfigError`` for settings the processes would refuse, before starting any."""
    spec.server.check(spec.cfg)
    spec.cluster.blocks(spec.cfg.num_shards)
    if spec.cluster.max_restarts > 0:
        several = any(len(block) > 1 for block in spec.cluster.blocks(spec.cfg.num_shards))
        d = model_size(spec.cfg)
        check_replayable(spec.server.checkpoint_interval(d), spec.client.replay_window(d),
                         generations=2 if several else 1)
    attack = spec.attack
    if spec.server.deadline() is not None and attack.proxy_holds_rounds:
        raise ConfigError(f"--round-timeout: the proxy attack {attack.proxy_attack} holds "
                          "each round until all n pushes are in, which a round closed "
                          "without some workers never has; use a value-level proxy "
                          "attack (gambler, bitflip) or a worker attack")


def resumable_spec(spec: ClusterSpec) -> ClusterSpec:
    """The spec that continues the run in ``spec.cluster.resume``: its own settings,
    its server processes resuming from their checkpoints (each at the newest round all
    its shards have); ``ConfigError`` if it cannot.

    ``spec.security`` comes from the resuming command line, checked against the run's
    saved command (``ps.launcher.cli.resumed_security``: the saved one is never used).
    A run whose keys the launcher generated (``<out-dir>/keys``) and whose command line
    names no ``--keys`` continues with those keys, not new ones (its servers resume only
    checkpoints tagged with their own key); the key directory is opened here, so that
    :class:`common.net.keys.KeyRing` refuses one it cannot trust (owner, modes, the
    directories above it) before anything starts. Each checkpoint is checked here as its
    server will check it (``CheckpointError`` naming the file), its size too: the
    shard's, counted from the run's model."""
    from server.checkpoint import (
        GroupFiles,
        checkpoint_path,
        expected_checkpoint,
        server_mac_key,
    )

    out = spec.out_dir
    cfg = spec.cfg
    present = [s for s in range(cfg.num_shards) if os.path.lexists(checkpoint_path(out, s))]
    security = spec.security
    if not security.insecure and security.keys is None and (present or (out / "keys").is_dir()):
        if not (out / "keys").is_dir():
            raise ConfigError(f"cannot resume {out} with keys: it holds checkpoints but no "
                              f"key directory {out / 'keys'} (its checkpoints are signed with "
                              f"the keys generated there, which this resume needs)")
        security = replace(security, keys=out / "keys")
    keys = security.ring("ps-cluster --resume") if present or security.keys else None
    d = model_size(cfg) if present else 0
    rounds = {}
    for block in spec.cluster.blocks(cfg.num_shards):  # each process, as it will resume
        files = GroupFiles(out, block, {s: server_mac_key(keys, s, block[0]) for s in block})
        ckpts = files.load({s: expected_checkpoint(cfg, s, finite=True, d=d)
                            for s in block}) if present else None
        rounds.update({s: ckpts[0].round if ckpts else 0 for s in block})
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
        if self._outcome is None:  # _run sets it before the thread ends
            raise RuntimeError("the cluster's thread ended without an outcome")
        return self._outcome

    def _run(self) -> None:
        try:
            self._outcome = self.cluster.run()
        except BaseException as exc:  # handed to join(): the run did not finish
            self._outcome = exc
