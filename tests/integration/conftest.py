"""Fixtures for tests that start real server, worker and proxy processes on loopback."""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from common.net.protocol import Header, decode
from ps.launcher.cluster import CHILD_ENV
from ps.launcher.processes import ManagedProcess, stop_all

RAW_REPLY_TIMEOUT_S = 20.0


def wait_for(condition: Callable[[], object], timeout_s: float, what: str) -> object:
    """Poll ``condition`` until truthy; fail the test with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")


HANDSHAKE_END = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                 | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                 | zmq.EVENT_DISCONNECTED)


_MONITORS = itertools.count()


def watched_dealer(ctx: zmq.Context, endpoint: str, curve=None) -> zmq.Socket:
    """A DEALER as ``connect_dealer`` makes it, whose handshake monitor is attached before
    it connects: an end that came before a monitor attached later would be missed (a
    plain socket's refused greeting ends within a millisecond on loopback). The monitor's
    address is its own (pyzmq's default names it by the socket's descriptor, which a
    socket just closed may still hold)."""
    from common.net.transport import configure

    sock = configure(ctx.socket(zmq.DEALER), 0)
    if curve is not None:
        sock.curve_secretkey, sock.curve_publickey = curve.secret, curve.public
        sock.curve_serverkey = curve.server
    sock.get_monitor_socket(
        HANDSHAKE_END, addr=f"inproc://handshake-{os.getpid()}-{next(_MONITORS)}")
    sock.connect(endpoint)
    return sock


def handshake_refused(sock: zmq.Socket, timeout_s: float = 20.0) -> bool:
    """The handshake of ``sock`` (a :func:`watched_dealer`) was refused (True: failed, or
    the connection dropped by the server) or succeeded (False). The wait outlasts the
    server's cut of a connection idle for 10 s."""
    from zmq.utils.monitor import recv_monitor_message

    monitor = sock.get_monitor_socket()  # the one attached before it connected
    try:
        if not monitor.poll(int(timeout_s * 1000)):
            pytest.fail("no handshake event")
        return recv_monitor_message(monitor)["event"] != zmq.EVENT_HANDSHAKE_SUCCEEDED
    finally:
        sock.disable_monitor()
        monitor.close(0)


def checkpoint_round(out: Path, cfg, shard: int, keys, process: int | None = None) -> int:
    """The round of shard ``shard``'s checkpoint in ``out``, -1 while it has none: a
    server's writer thread writes (and fsyncs) behind its rounds, seconds behind on a
    loaded host, so a test that kills a server waits for the checkpoint it expects."""
    from server.checkpoint import read_run_checkpoint
    from server.checkpoint.format import CheckpointError

    try:
        return read_run_checkpoint(out, cfg, shard, keys, finite=True, process=process).round
    except CheckpointError:
        return -1


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


def keys_in(directory: Path) -> Callable[..., list[str]]:
    """``make(S, n, proxies=())``: a run's keys in ``directory``, created once; the --keys
    flags."""
    from common.net.keys import create_keys

    def make(num_shards: int, num_workers: int, proxies: tuple[int, ...] = ()) -> list[str]:
        if not directory.exists():
            create_keys(directory, num_shards, num_workers, proxies)
        return ["--keys", str(directory)]

    return make


@pytest.fixture
def run_keys(tmp_path: Path) -> Callable[..., list[str]]:
    """``run_keys(S, n, proxies=())``: the run's keys, created once; the --keys flags."""
    return keys_in(tmp_path / "keys")


@pytest.fixture(scope="module")
def module_run_keys(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., list[str]]:
    """``run_keys`` shared by a module's tests (for what a module fixture starts)."""
    return keys_in(tmp_path_factory.mktemp("module") / "keys")


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path / "logs")
    yield procs
    stop_all(procs.started)


@pytest.fixture(scope="module")
def module_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processes]:
    """``processes`` for a module fixture: stopped when the module's tests are done."""
    procs = Processes(tmp_path_factory.mktemp("module-logs"))
    yield procs
    stop_all(procs.started)


class RawPeer:
    """A DEALER that sends arbitrary frames and collects replies with a deadline."""

    def __init__(self, endpoint: str) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.unanswered = 0  # messages ask_all saw no reply to

    def send(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames, copy=False)

    def replies(self, count: int, timeout_s: float = RAW_REPLY_TIMEOUT_S) -> list[Header]:
        """The next ``count`` replies; fails the test if they do not all come in time."""
        out: list[Header] = []
        for _ in range(count):
            if not self.sock.poll(int(timeout_s * 1000), zmq.POLLIN):
                pytest.fail(f"{len(out)} of {count} replies came within {timeout_s:g} s")
            frames = self.sock.recv_multipart()
            assert frames[0] == b"", frames[:2]
            out.append(decode(frames[1:]).header)
        return out

    def ask(self, frames: list[bytes]) -> Header:
        self.send(frames)
        return self.replies(1)[0]

    def ask_all(self, messages: list[list[bytes]], window: int = 8,
                quiet_s: float = 1.0) -> list[Header]:
        """Send ``messages``, at most ``window`` unanswered at a time (what piles up in
        the node's queues stays small), and return the replies that came. A node answers
        a peer's refusals beyond its rate not at all (``common/net/budgets.py``): once
        ``quiet_s`` passes without a reply, what is outstanding counts as unanswered
        (``self.unanswered``)."""
        out: list[Header] = []
        outstanding = 0
        for frames in messages:
            while outstanding >= window:
                outstanding = self._collect(out, outstanding, quiet_s)
            self.send(frames)
            outstanding += 1
        while outstanding:
            outstanding = self._collect(out, outstanding, quiet_s)
        return out

    def _collect(self, out: list[Header], outstanding: int, quiet_s: float) -> int:
        """One more reply into ``out``, or none within ``quiet_s``: what is outstanding
        then was dropped. How many remain outstanding."""
        if not self.sock.poll(int(quiet_s * 1000), zmq.POLLIN):
            self.unanswered += outstanding
            return 0
        frames = self.sock.recv_multipart()
        assert frames[0] == b"", frames[:2]
        out.append(decode(frames[1:]).header)
        return outstanding - 1

    def quiet(self, timeout_s: float) -> bool:
        """Nothing arrives within ``timeout_s``."""
        return not self.sock.poll(int(timeout_s * 1000), zmq.POLLIN)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def peers():
    """``peers(endpoint)``: a raw peer, closed at teardown."""
    made: list[RawPeer] = []

    def make(endpoint: str) -> RawPeer:
        made.append(RawPeer(endpoint))
        return made[-1]

    yield make
    for p in made:
        p.close()
