"""Domain exceptions and the process exit codes they map to.

Exit codes (documented in the README and every ``--help``):

* 0  the run finished;
* 2  configuration error (bad option, bad file, refused handshake);
* 3  protocol or peer error (a peer sent something this process cannot use);
* 4  timeout (the cluster stayed unreachable or a round never completed);
* 130 interrupted (SIGINT/SIGTERM before the run finished).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_PEER = 3
EXIT_TIMEOUT = 4
EXIT_INTERRUPTED = 130


class PSError(Exception):
    """Base of the errors that end a process with a meaningful exit code."""

    exit_code = 1


class ConfigError(PSError, ValueError):
    """Invalid configuration: options, files, or a handshake refused for a config mismatch."""

    exit_code = EXIT_CONFIG


class PeerError(PSError):
    """A peer answered with an error or with something this process cannot use."""

    exit_code = EXIT_PEER


class ClusterTimeout(PSError):
    """The cluster stayed unreachable, or a request got no answer in time."""

    exit_code = EXIT_TIMEOUT
