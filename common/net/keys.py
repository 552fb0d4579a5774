"""The CURVE key pairs of a run, one per identity, in ZeroMQ's certificate format.

A key directory holds, for each identity, ``<name>.key`` (the public key) and
``<name>.key_secret`` (public and secret key, readable by its owner only), as written by
``zmq.auth.create_certificates``. The name says who holds the key and its *scope*: what
it may reach and send (:meth:`Identity.reaches`, checked by the servers' ZAP handler
when a connection is made, and by ``common.net.scopes.check_claim`` for every message):

* ``server-<s>``: the server process whose first shard is s (a process is named by its
  first shard, ``common.net.sharding``; with one shard per process, the server of shard s);
  clients check they talk to this key;
* ``worker-<i>``: worker i, at every server; it may say HELLO and push only as worker i;
* ``evaluator``: every server; it may only PULL and ask STATUS;
* ``proxy-<s>``: the man-in-the-middle test tool in front of server process s: admitted
  only by that process, where it relays the sessions of the workers behind it, each
  message of theirs with the worker's own end-to-end tag (``common/net/relay_auth.py``). The
  workers sent through it expect its key; it holds no secret of the server's. A
  deployment creates one only when an experiment asks for a proxy: it can corrupt
  values only because the test gave it a key the server of its shard accepts.

``ps-keys`` writes a directory (secret files created mode 0600, never wider); every role
reads the keys it needs with :class:`KeyRing`, which refuses a key directory, or a key
file (public ones included), that is not owned by the process's user (or root) or that
others may write, a directory above it that others may write (without the sticky bit)
or another user owns, and a secret file that others may read or that is a symbolic link.
:func:`needed_keys` says which files a process of each identity loads (what a deployment
hands it, and nothing else).
"""

from __future__ import annotations

import functools
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from common.conf.settings import CLUSTER, EVALUATOR, PROXY, SERVER, WORKER, setting
from common.errors import ConfigError

PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
CLIENT_ROLES = ("worker", "evaluator", "proxy")
# canonical names only: ASCII digits without leading zeros (one name per identity)
_NAME = re.compile(r"(server|worker|proxy)-(0|[1-9][0-9]{0,8})|(evaluator)", re.ASCII)


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
        match = _NAME.fullmatch(name) if isinstance(name, str) else None
        if match is None:
            return None
        if match.group(3):
            return cls("evaluator")
        return cls(match.group(1), int(match.group(2)))

    def reaches(self, shard: int) -> bool:
        """Whether this client key may connect to the server process named ``shard``
        (its first shard): a worker or the evaluator at every one, a proxy only at the
        process it fronts."""
        if self.role in ("worker", "evaluator"):
            return True
        return self.role == "proxy" and self.index == shard


def key_names(num_shards: int, num_workers: int, proxies: Iterable[int] = ()) -> list[str]:
    """Every identity of a run with S servers, n workers, an evaluator and the proxies."""
    names = [f"server-{s}" for s in range(num_shards)]
    names += [f"worker-{i}" for i in range(num_workers)]
    names.append("evaluator")
    names += [f"proxy-{s}" for s in sorted(set(proxies))]
    return names


def needed_keys(name: str, num_shards: int, num_workers: int,
                proxies: Iterable[int] = ()) -> list[str]:
    """The key files a process speaking as ``name`` loads, and nothing more: its own
    secret file, then the public keys it checks its peers against.

    * ``server-<s>``: the public keys of the clients it admits (every worker, the
      evaluator, and ``proxy-<s>`` if shard s has a proxy);
    * ``evaluator``: the servers' public keys;
    * ``worker-<i>``: the servers' public keys, and those of the proxies (a worker sent
      through ``proxy-<s>`` expects its key there);
    * ``proxy-<s>``: ``server-<s>``'s public key (it connects to that server) and the
      workers' public keys (the clients it admits); nothing of the server's secret, so
      it can neither pose as the server nor forge its checkpoints, nor speak for a
      worker (``common/net/relay_auth.py``).
    """
    identity = Identity.parse(name)
    if identity is None:
        raise ConfigError(f"no identity is called {name!r}")
    proxied = set(proxies)
    workers = [f"worker-{i}{PUBLIC_SUFFIX}" for i in range(num_workers)]
    servers = [f"server-{s}{PUBLIC_SUFFIX}" for s in range(num_shards)]
    own = [name + SECRET_SUFFIX]
    if identity.role == "server":
        proxy = [f"proxy-{identity.index}{PUBLIC_SUFFIX}"] if identity.index in proxied else []
        return [*own, *workers, f"evaluator{PUBLIC_SUFFIX}", *proxy]
    if identity.role == "proxy":
        return [*own, f"server-{identity.index}{PUBLIC_SUFFIX}", *workers]
    if identity.role == "worker":
        return [*own, *servers, *(f"proxy-{s}{PUBLIC_SUFFIX}" for s in sorted(proxied))]
    return [*own, *servers]


def create_keys(directory: Path, num_shards: int, num_workers: int,
                proxies: Iterable[int] = (), force: bool = False) -> list[str]:
    """Write a key pair for every identity of a run into ``directory``; their names.

    Refuses (``ConfigError``) to overwrite existing keys unless ``force``: replacing the
    keys of a running cluster locks its members out. Every file is created under a
    umask of 077, so a secret is never readable by others, not even for a moment; the
    public files are then made world-readable (0644). A directory created here is mode
    0700.
    """
    names = key_names(num_shards, num_workers, proxies)
    previous = os.umask(0o077)
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        _check_directory(directory)
        _write_pairs(directory, names, force)
    finally:
        os.umask(previous)
    for name in names:
        os.chmod(directory / (name + PUBLIC_SUFFIX), 0o644)
    return names


def _write_pairs(directory: Path, names: list[str], force: bool) -> None:
    """Write the key pair of each name (``ConfigError`` if some exist, unless ``force``)."""
    import zmq.auth

    existing = [n for n in names if (directory / (n + PUBLIC_SUFFIX)).exists()
                or (directory / (n + SECRET_SUFFIX)).exists()]
    if existing and not force:
        raise ConfigError(f"{directory} already holds keys ({', '.join(existing[:3])}"
                          f"{', ...' if len(existing) > 3 else ''}); --force replaces them")
    for name in names:
        for suffix in (PUBLIC_SUFFIX, SECRET_SUFFIX):  # replaced, never rewritten in place
            (directory / (name + suffix)).unlink(missing_ok=True)
        zmq.auth.create_certificates(str(directory), name)


def _check_directory(directory: Path) -> None:
    """``ConfigError`` unless ``directory`` is safe to take keys from: owned by this
    process's user or root, writable by nobody else (others could add or replace a key
    that the run then admits), and so are the directories above it
    (:func:`_check_ancestors`)."""
    st = directory.stat()
    _check_owner(directory, st, "key directory", "its owner can add or replace keys; "
                 "write the keys into a directory of your own (ps-keys --dir)")
    mode = st.st_mode
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(f"key directory {directory} is writable by its group or by anyone "
                          f"(mode {stat.S_IMODE(mode):04o}): anyone who can add a key there "
                          f"joins the run; chmod go-w it")
    _check_ancestors(directory, f"key directory {directory}")


def _check_ancestors(path: Path, what: str) -> None:
    """``ConfigError`` if a directory above ``path`` (a key directory, or the file a
    public key's symbolic link points to; ``what`` names it in the message) is writable
    by others without the sticky bit, or owned by another user than this process's or
    root: whoever may rename an entry there can swap the whole key directory (or file)
    for one of their own, whatever the modes inside. A sticky directory (``/tmp``: mode
    1777) lets only an entry's owner rename it, so it is fine. Both the path as written
    (made absolute) and the path its symbolic links resolve to are walked up to ``/``: a
    few ``stat`` calls. Group write is not refused above the key directory (umask 002
    with a private group per user makes every directory so; the key directory itself
    must not be group-writable)."""
    euid = os.geteuid()
    seen: set[Path] = set()
    for walked in (Path(os.path.abspath(path)), Path(os.path.realpath(path))):
        for entry in (walked, *walked.parents[:-1]):  # each entry, in its parent
            parent = entry.parent
            if parent in seen:
                continue
            seen.add(parent)
            st = parent.stat()
            mode = stat.S_IMODE(st.st_mode)
            if st.st_uid not in (euid, 0):
                raise ConfigError(f"{what} lies in {parent}, owned by uid {st.st_uid}, not by "
                                  f"you (uid {euid}) nor root: its owner can rename "
                                  f"{entry.name} and swap in keys of their own; move the keys "
                                  f"to a directory of yours")
            if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
                raise ConfigError(f"{what} lies in {parent}, which anyone may write (mode "
                                  f"{mode:04o}, no sticky bit): anyone can rename "
                                  f"{entry.name} and swap in keys of their own; chmod o-w "
                                  f"{parent} (or chmod +t)")


def _check_owner(path: Path, st: os.stat_result, what: str, why: str) -> None:
    """``ConfigError`` unless ``path`` (``st``: its ``stat``) belongs to this process's
    user or to root (who can replace anything anyway)."""
    euid = os.geteuid()
    if st.st_uid not in (euid, 0):
        raise ConfigError(f"{what} {path} is owned by uid {st.st_uid}, not by you (uid "
                          f"{euid}) nor root: {why}")


def _check_key_file(path: Path, name: str, secret: bool) -> None:
    """``ConfigError`` unless the key file ``path`` (of ``name``) is safe to use: owned
    by this process's user or root, a secret readable by its owner only and not a
    symbolic link, a public key writable by its owner only (anyone who could replace
    ``worker-3.key`` would be admitted as worker 3). A public key may be a symbolic link:
    the file it points to is the one checked, and the directories above it too."""
    if secret:
        if path.is_symlink():
            raise ConfigError(f"secret key {path} is a symbolic link (to "
                              f"{os.path.realpath(path)}): put the file itself there, mode "
                              f"0600 (ps-keys writes it so)")
        st = path.stat()
        _check_owner(path, st, "secret key", "its owner can read it and replace it; use "
                     "keys of your own (ps-keys)")
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(f"secret key {path} is accessible to its group or to anyone "
                              f"(mode {stat.S_IMODE(st.st_mode):04o}); chmod 600 it")
        return
    st = path.stat()  # the file a symbolic link points to: the one opened
    _check_owner(path, st, "public key", f"its owner can replace it and be admitted as "
                 f"{name}; chown it to you or write new keys (ps-keys)")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(f"public key {path} is writable by its group or by anyone (mode "
                          f"{stat.S_IMODE(st.st_mode):04o}): anyone who can replace it is "
                          f"admitted as {name}; chmod go-w it")
    if path.is_symlink():
        real = os.path.realpath(path)
        _check_ancestors(Path(real), f"public key {path} (a link to {real})")


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
    """Reads the keys of a run from a key directory (as each role needs them).

    Refuses (``ConfigError``, one line naming the path, its owner or mode, and the fix)
    a directory or key file it cannot trust: one owned by another user than this
    process's (root is trusted: it can replace anything anyway), one others may write
    (a world-writable ``worker-3.key`` lets anyone be admitted as worker 3), a directory
    above the key directory that others may write without the sticky bit or that another
    user owns (whoever can rename the key directory can swap it), a secret file others
    may read, or a secret file that is a symbolic link. The directory is checked here,
    each file as it is loaded (``os.stat`` of the file opened)."""

    def __init__(self, directory: Path) -> None:
        if not directory.is_dir():
            raise ConfigError(f"key directory {directory} does not exist (create it with "
                              f"ps-keys, or run with --insecure)")
        _check_directory(directory)
        self.directory = directory

    def public(self, name: str) -> bytes:
        """The public key of ``name`` (z85, 40 bytes)."""
        return self._load(name, PUBLIC_SUFFIX)[0]

    def pair(self, name: str) -> tuple[bytes, bytes]:
        """(public, secret) of ``name``; ``ConfigError`` if its secret file is missing,
        others than its owner may read it (as ssh refuses such a private key), another
        user owns it or it is a symbolic link (:func:`_check_key_file`)."""
        public, secret = self._load(name, SECRET_SUFFIX)
        if secret is None:
            raise ConfigError(f"{self.directory / (name + SECRET_SUFFIX)} holds no secret key")
        return public, secret

    def server_curve(self, server: int, num_workers: int) -> CurveServer:
        """What server process ``server`` (its first shard) binds with: its key pair,
        and the client keys whose scope includes it (workers 0..n-1, the evaluator,
        ``proxy-<server>``)."""
        return CurveServer(*self.pair(f"server-{server}"), self.clients(server, num_workers))

    def front_curve(self, server: int, num_workers: int) -> CurveServer:
        """What the proxy in front of server process ``server`` binds with: its own key
        pair (``proxy-<server>``: the workers sent to it expect that key, ``--via-proxy``;
        it holds nothing of the server's), admitting the workers only (the evaluator
        reads the real servers)."""
        workers = {k: i for k, i in self.clients(server, num_workers).items()
                   if i.role == "worker"}
        return CurveServer(*self.pair(f"proxy-{server}"), workers)

    def client_curve(self, name: str, server: int, via_proxy: bool = False) -> CurveClient:
        """What ``name`` connects to server process ``server`` (its first shard) with;
        ``via_proxy``: through the ps-proxy in front of it, whose own key
        (``proxy-<server>``) it then expects there."""
        peer = f"proxy-{server}" if via_proxy else f"server-{server}"
        return CurveClient(*self.pair(name), self.public(peer))

    def server_relay_key(self, server: int, worker: int) -> bytes:
        """The key server process ``server`` shares end to end with worker ``worker``
        (``common.net.relay_auth``), from the server's side."""
        from common.net.relay_auth import pair_key

        public, secret = self.pair(f"server-{server}")
        worker_public = self.public(f"worker-{worker}")
        return pair_key(secret, worker_public, worker_public, public)

    def worker_relay_key(self, worker: int, server: int) -> bytes:
        """The key worker ``worker`` shares end to end with server process ``server``
        (``common.net.relay_auth``), from the worker's side."""
        from common.net.relay_auth import pair_key

        public, secret = self.pair(f"worker-{worker}")
        server_public = self.public(f"server-{server}")
        return pair_key(secret, server_public, public, server_public)

    def clients(self, server: int, num_workers: int) -> dict[bytes, Identity]:
        """The client identities of the directory whose scope includes server process
        ``server``, by public key: the evaluator, its proxy, and the workers of the run
        (a leftover key of a worker id the run does not have is not one)."""
        found: dict[bytes, Identity] = {}
        for path in sorted(self.directory.glob("*" + PUBLIC_SUFFIX)):
            identity = Identity.parse(path.name[: -len(PUBLIC_SUFFIX)])
            if (identity is not None and identity.role in CLIENT_ROLES
                    and identity.reaches(server)
                    and not (identity.role == "worker" and identity.index >= num_workers)):
                found[self.public(identity.name)] = identity
        return found

    def _load(self, name: str, suffix: str) -> tuple[bytes, bytes | None]:
        import zmq.auth

        path = self.directory / (name + suffix)
        if not path.is_file():
            raise ConfigError(f"no key for {name}: {path} is missing (ps-keys writes it)")
        _check_key_file(path, name, secret=suffix == SECRET_SUFFIX)
        try:
            return zmq.auth.load_certificate(str(path))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read the key {path}: {exc}") from exc
