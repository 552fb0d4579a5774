"""Child processes of the launcher: started with their log in a file, stopped for sure."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

STOP_GRACE_S = 5.0
PR_SET_PDEATHSIG = 1


@dataclass
class ManagedProcess:
    """One child process whose stdout and stderr go to ``log_path``."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=child_environment(self.env),
                start_new_session=True,  # Ctrl-C reaches the launcher only; it stops us
                preexec_fn=(functools.partial(die_with_parent, os.getpid())
                            if sys.platform == "linux" else None),
            )

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def returncode(self) -> int | None:
        """The exit code (-N: killed by signal N), None while it runs or before start."""
        return None if self.process is None else self.process.poll()

    @property
    def running(self) -> bool:
        return self.pid is not None and self.returncode is None

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the exit; whether it exited."""
        if self.process is None:
            raise RuntimeError(f"{self.name} was never started")
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def signal(self, signum: int) -> None:
        pid = self.pid
        if self.running and pid is not None:  # (running: it has one)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signum)

    def tail(self, lines: int = 15) -> list[str]:
        """The last ``lines`` lines of the process's log."""
        try:
            with self.log_path.open("r", encoding="utf-8", errors="replace") as f:
                return [line.rstrip("\n") for line in deque(f, maxlen=lines)]
        except FileNotFoundError:
            return []


def die_with_parent(launcher: int) -> None:
    """(In the child, before exec.) Get SIGTERM when the launcher dies, even by SIGKILL:
    no orphan keeps a port, and every server saves its checkpoint on the way out. A
    launcher that died before the signal was armed is noticed too."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != launcher:
        os.kill(os.getpid(), signal.SIGTERM)


def child_environment(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment without its ``PS_*`` settings, plus ``extra``.

    Children get their configuration as explicit flags; a ``PS_*`` variable meant
    for the launcher (say ``PS_EVALUATE`` or ``PS_WORKER_ID``) must not leak into them.
    """
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("PS_")}
    return {**inherited, **extra}


def stop_all(processes: list[ManagedProcess], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM every running process, SIGKILL what is still alive after ``grace_s``."""
    for p in processes:
        p.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in processes:
        if p.pid is None:
            continue
        if not p.wait(max(0.0, deadline - time.monotonic())):
            p.signal(signal.SIGKILL)
            p.wait(STOP_GRACE_S)
