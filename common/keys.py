"""The CURVE key pairs of a run, one per identity, in ZeroMQ's certificate format.

A key directory holds, for each identity, ``<name>.key`` (the public key) and
``<name>.key_secret`` (public and secret key, readable by its owner only), as written by
``zmq.auth.create_certificates``. The names say who holds the key and what it may do:

* ``server-<s>``: the server of shard s (workers check they talk to this key);
* ``worker-<i>``: worker i, which may push only as worker i;
* ``evaluator``: may only PULL and ask STATUS;
* ``proxy-<s>``: the man-in-the-middle test tool of shard s, a relay the server trusts
  to speak for workers. A deployment never creates these: a proxy can corrupt values
  only because the test gave it a key the servers accept (and the key of the server it
  impersonates).

``ps-keys`` writes a directory; every role reads the keys it needs with :class:`KeyRing`.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from common.errors import ConfigError
from common.settings import CLUSTER, EVALUATOR, PROXY, SERVER, WORKER, setting

PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
CLIENT_ROLES = ("worker", "evaluator", "proxy")
_NAME = re.compile(r"^(server|worker|proxy)-(\d+)$|^(evaluator)$")


@dataclass(frozen=True)
class Identity:
    """Who holds a key: a role and, for servers, workers and proxies, an index."""

    role: str
    index: int = -1

    @property
    def name(self) -> str:
        return self.role if self.index < 0 else f"{self.role}-{self.index}"

    @classmethod
    @functools.lru_cache(maxsize=1024)  # parsed for every message a server receives
    def parse(cls, name: str) -> Identity | None:
        """The identity a key file's name stands for, or None for a foreign name."""
        match = _NAME.match(name)
        if match is None:
            return None
        if match.group(3):
            return cls("evaluator")
        return cls(match.group(1), int(match.group(2)))


def key_names(num_shards: int, num_workers: int, proxies: Iterable[int] = ()) -> list[str]:
    """Every identity of a run with S servers, n workers, an evaluator and the proxies."""
    names = [f"server-{s}" for s in range(num_shards)]
    names += [f"worker-{i}" for i in range(num_workers)]
    names.append("evaluator")
    names += [f"proxy-{s}" for s in sorted(set(proxies))]
    return names


def create_keys(directory: Path, num_shards: int, num_workers: int,
                proxies: Iterable[int] = (), force: bool = False) -> list[str]:
    """Write a key pair for every identity of a run into ``directory``; their names.

    Refuses (``ConfigError``) to overwrite existing keys unless ``force``: replacing the
    keys of a running cluster locks its members out. Secret files are mode 0600 and a
    directory created here is mode 0700.
    """
    import zmq.auth

    names = key_names(num_shards, num_workers, proxies)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    existing = [n for n in names if (directory / (n + PUBLIC_SUFFIX)).exists()
                or (directory / (n + SECRET_SUFFIX)).exists()]
    if existing and not force:
        raise ConfigError(f"{directory} already holds keys ({', '.join(existing[:3])}"
                          f"{', ...' if len(existing) > 3 else ''}); --force replaces them")
    for name in names:
        _, secret_file = zmq.auth.create_certificates(str(directory), name)
        os.chmod(secret_file, 0o600)
    return names


@dataclass(frozen=True)
class CurveServer:
    """A CURVE server's key pair and the client keys it admits, with their identities."""

    public: bytes
    secret: bytes
    clients: dict[bytes, Identity]


@dataclass(frozen=True)
class CurveClient:
    """A CURVE client's key pair and the key the server it connects to must hold."""

    public: bytes
    secret: bytes
    server: bytes


@dataclass(frozen=True)
class SecurityOptions:
    """Whether a process authenticates and encrypts with the run's keys (the default)."""

    keys: Path | None = setting(
        None, "Directory of the run's CURVE keys (written by ps-keys; ps-cluster: default "
        "<out-dir>/keys, generated for the run).",
        roles=(SERVER, WORKER, EVALUATOR, PROXY, CLUSTER))
    insecure: bool = setting(
        False, "Run without keys: no authentication, no encryption; anyone who reaches a "
        "port can push as any worker. For trusted networks and tests only.",
        roles=(SERVER, WORKER, EVALUATOR, PROXY, CLUSTER))

    def ring(self, command: str) -> KeyRing | None:
        """The key ring to use, None with ``--insecure``; ``ConfigError`` if neither."""
        if self.insecure:
            if self.keys is not None:
                raise ConfigError(f"{command}: --keys and --insecure contradict each other")
            return None
        if self.keys is None:
            raise ConfigError(f"{command} refuses to start without --keys DIR (the run's keys, "
                              f"from ps-keys); --insecure runs unauthenticated")
        return KeyRing(self.keys)


class KeyRing:
    """Reads the keys of a run from a key directory (as each role needs them)."""

    def __init__(self, directory: Path) -> None:
        if not directory.is_dir():
            raise ConfigError(f"key directory {directory} does not exist (create it with "
                              f"ps-keys, or run with --insecure)")
        self.directory = directory

    def public(self, name: str) -> bytes:
        """The public key of ``name`` (z85, 40 bytes)."""
        return self._load(name, PUBLIC_SUFFIX)[0]

    def pair(self, name: str) -> tuple[bytes, bytes]:
        """(public, secret) of ``name``; ``ConfigError`` if its secret file is missing."""
        public, secret = self._load(name, SECRET_SUFFIX)
        if secret is None:
            raise ConfigError(f"{self.directory / (name + SECRET_SUFFIX)} holds no secret key")
        return public, secret

    def server_curve(self, shard: int) -> CurveServer:
        """What the server of ``shard`` (or a proxy impersonating it) binds with."""
        return CurveServer(*self.pair(f"server-{shard}"), self.clients())

    def client_curve(self, name: str, shard: int) -> CurveClient:
        """What ``name`` connects to the server of ``shard`` with."""
        return CurveClient(*self.pair(name), self.public(f"server-{shard}"))

    def clients(self) -> dict[bytes, Identity]:
        """Every client identity (worker, evaluator, proxy) by its public key."""
        found: dict[bytes, Identity] = {}
        for path in sorted(self.directory.glob("*" + PUBLIC_SUFFIX)):
            identity = Identity.parse(path.name[: -len(PUBLIC_SUFFIX)])
            if identity is not None and identity.role in CLIENT_ROLES:
                found[self.public(identity.name)] = identity
        return found

    def _load(self, name: str, suffix: str) -> tuple[bytes, bytes | None]:
        import zmq.auth

        path = self.directory / (name + suffix)
        if not path.is_file():
            raise ConfigError(f"no key for {name}: {path} is missing (ps-keys writes it)")
        try:
            return zmq.auth.load_certificate(str(path))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read the key {path}: {exc}") from exc
