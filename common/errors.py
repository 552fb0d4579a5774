"""Domain exceptions and the process exit codes they map to.

Exit codes (documented in the README and every ``--help``):

* 0  the run finished;
* 1  internal error: a bug, reported with its traceback;
* 2  configuration error (bad option, bad file, refused handshake);
* 3  protocol or peer error (a peer sent something this process cannot use);
* 4  timeout (the cluster stayed unreachable or a round never completed);
* 5  reference mismatch (``ps-cluster --verify``, ``ps-experiment --verify-sample``: the
  cluster's final parameters differ from the in-process reference engine's);
* 130 interrupted (SIGINT/SIGTERM before the run finished).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_CONFIG = 2
EXIT_PEER = 3
EXIT_TIMEOUT = 4
EXIT_MISMATCH = 5
EXIT_INTERRUPTED = 130

EXIT_CODES_TEXT = (
    "Exit codes: 0 finished, 1 internal error (a bug; traceback in the log), "
    "2 configuration error, 3 protocol/peer error, 4 timeout, 5 the cluster's result differs "
    "from the reference engine's, 130 interrupted."
)


class PSError(Exception):
    """Base of the errors that end a process with a meaningful exit code."""

    exit_code = EXIT_INTERNAL


class ConfigError(PSError, ValueError):
    """Invalid configuration: options, files, or a handshake refused for a config mismatch."""

    exit_code = EXIT_CONFIG


class PeerError(PSError):
    """A peer answered with an error or with something this process cannot use."""

    exit_code = EXIT_PEER


class ClusterTimeout(PSError):
    """The cluster stayed unreachable, or a request got no answer in time."""

    exit_code = EXIT_TIMEOUT


class ReferenceMismatch(PSError):
    """The cluster ran to the end, and its final parameters differ from those of the
    in-process reference engine run with the same settings."""

    exit_code = EXIT_MISMATCH


class Interrupted(PSError):
    """SIGTERM or SIGINT asked the process to stop before its run finished."""

    exit_code = EXIT_INTERRUPTED
