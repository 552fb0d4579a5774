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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from common.config import AttackConfig, RunConfig
from common.errors import ClusterTimeout, PSError
from common.metrics import read_jsonl
from ps.processes import ManagedProcess, stop_all
from server.checkpoint import checkpoint_path, load_checkpoint

log = logging.getLogger("ps.cluster")

READY_TIMEOUT_S = 180.0
WATCH_INTERVAL_S = 0.5
CHILD_ENV = {
    # one compute thread per process: many processes share few cores
    "PS_TORCH_THREADS": "1",
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
    """Everything the launcher needs to start one run."""

    cfg: RunConfig
    attack: AttackConfig
    out_dir: Path
    data_dir: str | None = None
    host: str = "127.0.0.1"
    eval_every: int = 10
    eval_samples: int | None = None
    evaluator: bool = True
    timeout_s: float = 60.0
    retries: int = 3
    run_timeout_s: float | None = None


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


def run_config_args(cfg: RunConfig) -> list[str]:
    """Command-line flags reproducing ``cfg`` exactly (floats by repr)."""
    args = [
        "--model", cfg.model, "--dataset", cfg.dataset,
        "--workers", str(cfg.num_workers), "--shards", str(cfg.num_shards),
        "--rule", cfg.rule, "--q", str(cfg.q), "--lr", repr(cfg.lr),
        "--batch-size", str(cfg.batch_size), "--rounds", str(cfg.rounds),
        "--seed", str(cfg.seed),
    ]
    if cfg.multikrum_m is not None:
        args += ["--multikrum-m", str(cfg.multikrum_m)]
    return args


def attack_parameter_args(attack: AttackConfig) -> list[str]:
    """Flags for the numeric attack parameters (shared by workers and proxies)."""
    args = [
        "--gambler-p", repr(attack.gambler_p), "--gambler-scale", repr(attack.gambler_scale),
        "--bitflip-bits", ",".join(map(str, attack.bitflip_bits)),
        "--bitflip-coords", str(attack.bitflip_coords),
        "--gaussian-sd", repr(attack.gaussian_sd),
        "--omniscient-scale", repr(attack.omniscient_scale),
        "--signflip-scale", repr(attack.signflip_scale),
        "--ipm-epsilon", repr(attack.ipm_epsilon),
    ]
    if attack.alie_z is not None:
        args += ["--alie-z", repr(attack.alie_z)]
    return args


class Cluster:
    """Starts, watches and stops the processes of one run."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.out = spec.out_dir
        self.run_dir = self.out / "run"
        self.logs = self.out / "logs"
        self.processes: list[ManagedProcess] = []
        self.started = 0.0

    # -- lifecycle ---------------------------------------------------------------

    def run(self, on_progress: Callable[[Progress], None] | None = None) -> ClusterResult:
        """Start everything, wait for the run to finish, return the result; always clean up."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        (self.out / "config.json").write_text(
            json.dumps({"run": self.spec.cfg.to_dict(), "attack": self.spec.attack.to_dict()},
                       indent=2) + "\n", encoding="utf-8")
        self.started = time.monotonic()
        try:
            servers = self._start_servers()
            fronts = self._start_proxies(servers)
            self._start_workers(fronts)
            if self.spec.evaluator:
                self._start_evaluator(servers)
            self._watch(on_progress)
        finally:
            stop_all(self.processes)
        return self._result()

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

    def _start_servers(self) -> list[str]:
        cfg = self.spec.cfg
        ready = []
        for s in range(cfg.num_shards):
            ready_file = self.run_dir / f"server-{s}.endpoint"
            ready_file.unlink(missing_ok=True)
            self._child(f"server-{s}", "server.cli", [
                "--shard", str(s), "--bind", f"tcp://{self.spec.host}:*",
                "--out-dir", str(self.out), "--ready-file", str(ready_file),
                *run_config_args(cfg),
            ])
            ready.append(ready_file)
        return self._await_endpoints(ready)

    def _start_proxies(self, servers: list[str]) -> list[str]:
        """Endpoints the workers use: the proxy's for fronted shards, else the server's."""
        attack = self.spec.attack
        if attack.proxy_attack == "none":
            return list(servers)
        fronts = list(servers)
        ready = {}
        for s in attack.proxy_shards:
            ready_file = self.run_dir / f"proxy-{s}.endpoint"
            ready_file.unlink(missing_ok=True)
            args = [
                "--bind", f"tcp://{self.spec.host}:*", "--server", servers[s],
                "--proxy-attack", attack.proxy_attack,
                "--proxy-victims", ",".join(map(str, attack.proxy_victims)),
                "--out-dir", str(self.out), "--ready-file", str(ready_file),
                *attack_parameter_args(attack), *run_config_args(self.spec.cfg),
            ]
            if attack.corrupt_params:
                args.append("--corrupt-params")
            self._child(f"proxy-{s}", "ps.proxy_cli", args)
            ready[s] = ready_file
        for s, endpoint in zip(ready, self._await_endpoints(list(ready.values())), strict=True):
            fronts[s] = endpoint
        return fronts

    def _start_workers(self, endpoints: list[str]) -> None:
        cfg, attack = self.spec.cfg, self.spec.attack
        for i in range(cfg.num_workers):
            args = [
                "--servers", ",".join(endpoints), "--worker-id", str(i),
                "--out-dir", str(self.out), *self._client_args(), *run_config_args(cfg),
            ]
            if attack.is_byzantine(i):
                args += [
                    "--attack", attack.worker_attack,
                    "--byzantine-workers", ",".join(map(str, attack.byzantine_workers)),
                    *attack_parameter_args(attack),
                ]
            self._child(f"worker-{i}", "worker.cli", args)

    def _start_evaluator(self, servers: list[str]) -> None:
        args = [
            "--servers", ",".join(servers), "--evaluate",
            "--eval-every", str(self.spec.eval_every), "--out-dir", str(self.out),
            *self._client_args(), *run_config_args(self.spec.cfg),
        ]
        if self.spec.eval_samples is not None:
            args += ["--eval-samples", str(self.spec.eval_samples)]
        self._child("evaluator", "worker.cli", args)

    def _client_args(self) -> list[str]:
        args = ["--timeout", repr(self.spec.timeout_s), "--retries", str(self.spec.retries)]
        if self.spec.data_dir:
            args += ["--data-dir", self.spec.data_dir]
        return args

    # -- waiting -----------------------------------------------------------------

    def _await_endpoints(self, ready_files: list[Path]) -> list[str]:
        """Wait (deadline ``READY_TIMEOUT_S``) until every ready file names an endpoint."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            self._raise_if_failed()
            if all(f.exists() for f in ready_files):
                return [f.read_text(encoding="utf-8").strip() for f in ready_files]
            if time.monotonic() > deadline:
                missing = [f.name for f in ready_files if not f.exists()]
                raise ClusterTimeout(f"not ready after {READY_TIMEOUT_S:g} s: {missing}")
            time.sleep(0.05)

    def _watch(self, on_progress: Callable[[Progress], None] | None) -> None:
        """Until every process exited 0; raise at the first failure or the run deadline."""
        limit = self.spec.run_timeout_s
        while True:
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
        from ps.simulate import params_digest

        shards = [load_checkpoint(checkpoint_path(self.out, s)).params
                  for s in range(self.spec.cfg.num_shards)]
        params = np.concatenate(shards)
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
