"""Role processes forked from a prepared launcher.

``ps-cluster`` (``--start fork``, the default) imports torch and the role modules, loads
the compiled aggregation kernels and decodes the dataset once, in itself
(:func:`prepare`), and then starts every server, proxy, worker and the evaluator as a
fork of itself (:class:`ForkedProcess`). Each is still a process of its own: its own
session, sockets, log file, exit code and ``PR_SET_PDEATHSIG``; it runs the very
command a deployment would start (``ps-server``, ``ps-proxy``, ``ps-worker``) with the
same flags, named after its role (``ps -o comm``: ``server-0``, ``worker-3``; its command
line is the launcher's). What the fork saves is the start-up every child would repeat (about 1.7 s
and 200 MB of imports each) and the memory: the children share the launcher's pages
(the libraries, the dataset) until they write them. ``--start exec`` starts each child
as a fresh interpreter instead (``python -m server.cli ...``), as a deployment does.

Forking is safe here because the launcher holds no thread, socket or ZeroMQ context
when it forks, and torch has run no parallel operation (one thread is pinned first).
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import NoReturn

from common.run.config import RunConfig
from ps.launcher.processes import ManagedProcess, child_environment, die_with_parent

# the module each role's command lives in, as ``python -m`` would run it
ROLE_MODULES = ("server.cli", "ps.proxy.cli", "worker.cli")
# what the roles import lazily once they run, loaded before forking so no child repeats it
RUNTIME_MODULES = ("torch", "zmq", "server.node", "ps.proxy.node", "worker.run",
                   "worker.evaluator", "common.learn.rules.kernels.networks",
                   "common.learn.rules.kernels.gram", "common.learn.rules.kernels.reductions",
                   "common.learn.rules.kernels.subsets", "common.run.model_init")
POLL_S = 0.01
PR_SET_NAME = 15


@dataclass
class Preparation:
    """What :func:`prepare` did and how long each part took (seconds)."""

    imports_s: float = 0.0
    kernels_s: float = 0.0
    dataset_s: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {"imports_s": round(self.imports_s, 3), "kernels_s": round(self.kernels_s, 3),
                "dataset_s": round(self.dataset_s, 3)}


def prepare(cfg: RunConfig, data_dir: Path | None, torch_threads: int) -> Preparation:
    """Load in this process what every child needs: the modules, the rule's compiled
    kernels (from numba's on-disk cache after the first run) and the dataset."""
    done = Preparation()
    started = time.perf_counter()
    import torch

    torch.set_num_threads(torch_threads)  # before any torch operation: no thread pool
    for module in (*ROLE_MODULES, *RUNTIME_MODULES):
        import_module(module)
    done.imports_s = time.perf_counter() - started
    started = time.perf_counter()
    _warm_defence(cfg)
    done.kernels_s = time.perf_counter() - started
    started = time.perf_counter()
    from common.learn.data import preload_dataset

    preload_dataset(cfg.dataset, data_dir, seed=cfg.seed, validation=cfg.validation)
    done.dataset_s = time.perf_counter() - started
    gc.collect()
    gc.freeze()  # the children's collections never touch (and so never copy) these pages
    return done


def _warm_defence(cfg: RunConfig) -> None:
    """Aggregate a small matrix with the run's defence (pre-aggregation chain and rule):
    their kernels are then compiled (or loaded from numba's cache) in the children
    already."""
    from common.learn.rules.defence import probe_defence

    probe_defence(cfg)


def role_command(module: str) -> Callable[..., None]:
    """The click command a role module runs under ``python -m``."""
    return import_module(module).main


@dataclass
class ForkedProcess(ManagedProcess):
    """A child forked from this (prepared) process, running ``module``'s command with
    ``argv[3:]`` (the flags after ``python -m module``); a ``ManagedProcess`` otherwise."""

    child_pid: int | None = None
    exit_code: int | None = field(default=None, repr=False)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        module, args = self.argv[2], self.argv[3:]
        command = role_command(module)
        env = child_environment(self.env)
        launcher = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _run_child(self.name, command, module, args, self.log_path, env, launcher)
        self.child_pid = pid

    @property
    def pid(self) -> int | None:
        return self.child_pid

    @property
    def returncode(self) -> int | None:
        if self.exit_code is None and self.child_pid is not None:
            pid, status = os.waitpid(self.child_pid, os.WNOHANG)
            if pid:
                self.exit_code = os.waitstatus_to_exitcode(status)
        return self.exit_code

    def wait(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.returncode is None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)
        return True


def _set_name(name: str) -> None:
    """Name this process ``name`` (``ps -o comm``, ``top``, ``/proc/PID/comm``; at most
    15 bytes): its command line is the launcher's."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def _run_child(name: str, command: Callable[..., None], module: str, args: list[str],
               log_path: Path, env: dict[str, str], launcher: int) -> NoReturn:
    """(In the forked child.) Become the role's process and exit with its code."""
    code = 1
    try:
        os.setsid()  # Ctrl-C reaches the launcher only; it stops us
        die_with_parent(launcher)
        _set_name(name)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(devnull)
        # fresh streams on the log (the launcher's may be replaced, e.g. under pytest)
        out = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stdout = sys.__stdout__ = out  # type: ignore[misc]  # Final in typeshed
        err = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = sys.__stderr__ = err  # type: ignore[misc]  # Final in typeshed
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [module, *args]
        command(args=args, prog_name=module, standalone_mode=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
