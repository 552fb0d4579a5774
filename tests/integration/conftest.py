"""Fixtures for tests that start real server, worker and proxy processes on loopback."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ps.launcher.cluster import CHILD_ENV
from ps.launcher.processes import ManagedProcess, stop_all


def wait_for(condition: Callable[[], object], timeout_s: float, what: str) -> object:
    """Poll ``condition`` until truthy; fail the test with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")


class Processes:
    """Starts module CLIs as child processes and always stops them at teardown."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[ManagedProcess] = []

    def start(self, name: str, module: str, args: list[str]) -> ManagedProcess:
        process = ManagedProcess(name, [sys.executable, "-m", module, *args],
                                 self.log_dir / f"{name}.log", env=CHILD_ENV)
        process.start()
        self.started.append(process)
        return process

    def wait_exit(self, process: ManagedProcess, timeout_s: float) -> int:
        wait_for(lambda: process.returncode is not None, timeout_s, f"{process.name} to exit")
        return process.returncode

    def endpoint(self, ready_file: Path, process: ManagedProcess, timeout_s: float = 60) -> str:
        def ready() -> str:
            if process.returncode is not None:
                pytest.fail(f"{process.name} exited {process.returncode}: {process.tail()}")
            return ready_file.read_text().strip() if ready_file.exists() else ""

        return str(wait_for(ready, timeout_s, f"{process.name} to listen"))


@pytest.fixture
def run_keys(tmp_path: Path) -> Callable[..., list[str]]:
    """``run_keys(S, n, proxies=())``: the run's keys, created once; the --keys flags."""
    from common.keys import create_keys

    directory = tmp_path / "keys"

    def make(num_shards: int, num_workers: int, proxies: tuple[int, ...] = ()) -> list[str]:
        if not directory.exists():
            create_keys(directory, num_shards, num_workers, proxies)
        return ["--keys", str(directory)]

    return make


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path / "logs")
    yield procs
    stop_all(procs.started)
