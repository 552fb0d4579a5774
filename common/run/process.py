"""Start-up and shutdown of every role's process: one policy for all of them.

* Logging: human-readable lines on stderr, tagged with the process's name; with
  ``--log-file`` to that file instead, rotated at ``--log-max-mb`` (two older files
  kept), so no peer can fill a disk through a node's log.
* Threads: a role that computes with torch pins it to ``--torch-threads`` (default 1:
  many processes share few cores, and the bit-exact check needs the same reductions
  everywhere); torch is imported only by those roles.
* Stopping: SIGTERM and SIGINT only *request* a stop (:func:`request_stop`); every
  loop checks it (:func:`check_stop`) between two messages or rounds and raises
  :class:`Interrupted`, so a server never stops half-way through a round step and
  always saves its checkpoint on the way out.
* Exit codes: a :class:`PSError` ends the process with its code and a one-line
  message; anything else is a bug, logged with its traceback, exit 1.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import logging.handlers
import os
import resource
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from common.conf.settings import (
    CLUSTER,
    EVALUATOR,
    PROXY,
    ROLES,
    SERVER,
    SIMULATE,
    WORKER,
    setting,
)
from common.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, Interrupted, PSError

log = logging.getLogger("ps.process")
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_stop = threading.Event()


@dataclass(frozen=True)
class ProcessOptions:
    """Settings every process of a run has: where its files go, threads, log level."""

    out_dir: Path | None = setting(
        None, "Directory for this process's files: metrics (*.jsonl), checkpoints, logs "
        "and summary (ps-cluster: default runs/<time>-<rule>).", roles=ROLES)
    ready_file: Path | None = setting(
        None, "Write the bound endpoint here once listening (for launchers and health "
        "checks).", roles=(SERVER, PROXY))
    torch_threads: int = setting(
        1, "Compute threads of torch in this process (many processes share few cores; "
        "the bit-exact check needs the same value everywhere).",
        roles=(SERVER, WORKER, EVALUATOR, CLUSTER, SIMULATE), minimum=1)
    verbose: bool = setting(False, "Debug logging.", short="-v", roles=ROLES)
    log_file: Path | None = setting(
        None, "Write log lines to this file instead of stderr, rotated at --log-max-mb "
        "(FILE.1 and FILE.2 keep the two before; ps-cluster: logs/<process>.log).",
        roles=ROLES)
    log_max_mb: float = setting(20.0, "Size (MB) at which --log-file is rotated.", roles=ROLES,
                                minimum=0.01)


def check_stop() -> None:
    """Raise :class:`Interrupted` if a stop was requested."""
    if _stop.is_set():
        raise Interrupted("stopped by a signal")


def request_stop(*_: object) -> None:
    """Ask every loop of this process to stop (the signal handler)."""
    _stop.set()


LOG_BACKUPS = 2


class _RotatingLog(logging.handlers.RotatingFileHandler):
    """A rotating log file that, when this process's stdout and stderr are that file
    too (a ps-cluster child: a crash's traceback goes there), moves them to the new file
    at each rotation, so they never end in a rotated or deleted one."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        super().__init__(path, maxBytes=max_bytes, backupCount=LOG_BACKUPS, encoding="utf-8")
        self.std_fds = [fd for fd in (1, 2) if _same_file(fd, self._fileno())]

    def doRollover(self) -> None:
        super().doRollover()
        for fd in self.std_fds:
            os.dup2(self._fileno(), fd)

    def _fileno(self) -> int:
        """The log file's descriptor: it is open (the handler is not ``delay``ed, so
        ``__init__`` and each rollover open it)."""
        if self.stream is None:
            raise RuntimeError("the log file is not open")
        return self.stream.fileno()


def _same_file(a: int, b: int) -> bool:
    try:
        sa, sb = os.fstat(a), os.fstat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def setup_logging(name: str, verbose: bool = False, log_file: Path | None = None,
                  max_mb: float = 20.0) -> None:
    """Human-readable log lines tagged with the process name: on stderr, or in
    ``log_file`` rotated at ``max_mb`` MB (``LOG_BACKUPS`` older files kept)."""
    handler: logging.Handler
    if log_file is None:
        handler = logging.StreamHandler(sys.stderr)
    else:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handler = _RotatingLog(log_file, int(max_mb * 1e6))
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=f"%(asctime)s {name} %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
        handlers=[handler],
        force=True,
    )


def keep_freed_memory() -> None:
    """Serve large allocations from the heap and keep freed memory for reuse (glibc).

    By default glibc maps allocations above 128 KiB afresh and unmaps them when freed,
    so each gradient-sized tensor (a few hundred KB, several per round) costs page
    faults on every use. Measured on the quick-start cluster (20 workers, 4 servers):
    113 ms of CPU per round in all processes that way, 101 ms with a fixed threshold of
    64 MiB and a trim threshold of 256 MiB, which keep such buffers in the heap.
    No-op where glibc's ``mallopt`` is absent.
    """
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, 64 << 20)
    mallopt(_M_TRIM_THRESHOLD, 256 << 20)


def freeze_startup_objects() -> None:
    """Exclude every object alive after start-up from the garbage collector's scans.

    A role's loop allocates and frees a few hundred objects per message, which
    triggers collections; each older-generation collection used to traverse every
    module, registry and click object loaded at start-up. Measured on the quick-start
    cluster (20 workers, 4 servers): collections were 11 % of a worker's interpreter
    time. Call once, after start-up and before the loop.
    """
    gc.collect()
    gc.freeze()


def raise_file_limit() -> None:
    """Raise the soft limit of open file descriptors to the hard limit.

    Every connection costs a node a descriptor; at the default soft limit (often 1024)
    idle connections alone can starve the node of the descriptors a checkpoint needs.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= hard:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, resource.getrlimit(
            resource.RLIMIT_NOFILE)[1]))
    except (ValueError, OSError) as exc:
        log.warning("cannot raise the open-file limit from %d to %d: %s", soft, hard, exc)


def pin_torch_threads(threads: int) -> None:
    """Use ``threads`` torch threads in this process (imports torch)."""
    import torch

    torch.set_num_threads(threads)


def run_process(name: str, options: ProcessOptions, main: Callable[[], None],
                uses_torch: bool = False) -> None:
    """Run a role's ``main`` under the common policy and exit with its code."""
    setup_logging(name, options.verbose, options.log_file, options.log_max_mb)
    _stop.clear()
    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    code = EXIT_OK
    raise_file_limit()
    try:
        if uses_torch:
            keep_freed_memory()
            pin_torch_threads(options.torch_threads)
        main()
    except Interrupted:
        print("interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    except PSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = exc.exit_code
    except Exception:
        log.exception("internal error (a bug); please report it with this traceback")
        code = EXIT_INTERNAL
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    sys.exit(code)
