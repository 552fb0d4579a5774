"""Key files: canonical names, scopes, what each process loads, modes from the first byte."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from common.errors import ConfigError
from common.net.keys import (
    PUBLIC_SUFFIX,
    SECRET_SUFFIX,
    Identity,
    KeyRing,
    create_keys,
    key_names,
    needed_keys,
)


@pytest.mark.parametrize("name", ["worker-007", "worker-+1", "worker-١", "worker--1",
                                  "worker-1 ", "Worker-1", "evaluator-0", "server",
                                  "proxy-", "worker-1\n", "worker-99999999999"])
def test_only_canonical_names_are_identities(name: str) -> None:
    assert Identity.parse(name) is None


@pytest.mark.parametrize(("name", "identity"), [
    ("worker-0", Identity("worker", 0)), ("worker-17", Identity("worker", 17)),
    ("proxy-3", Identity("proxy", 3)), ("server-1", Identity("server", 1)),
    ("evaluator", Identity("evaluator")),
])
def test_canonical_names_parse_and_print_back(name: str, identity: Identity) -> None:
    assert Identity.parse(name) == identity and identity.name == name


@pytest.mark.parametrize(("name", "reaches"), [
    ("worker-2", {0, 1, 2}), ("evaluator", {0, 1, 2}), ("proxy-1", {1}),
    ("server-1", set()),
])
def test_a_key_reaches_the_shards_of_its_scope(name: str, reaches: set[int]) -> None:
    assert {s for s in range(3) if Identity.parse(name).reaches(s)} == reaches


def test_each_process_loads_its_own_secret_and_the_public_keys_it_checks() -> None:
    assert needed_keys("worker-1", 2, 3, (0,)) == [
        "worker-1.key_secret", "server-0.key", "server-1.key", "proxy-0.key"]
    assert needed_keys("worker-1", 2, 3) == ["worker-1.key_secret", "server-0.key",
                                             "server-1.key"]
    assert needed_keys("server-0", 2, 2, (0,)) == [
        "server-0.key_secret", "worker-0.key", "worker-1.key", "evaluator.key", "proxy-0.key"]
    assert needed_keys("server-1", 2, 2, (0,)) == [
        "server-1.key_secret", "worker-0.key", "worker-1.key", "evaluator.key"]
    # the proxy holds no secret of the server's (it could pose as it, forge checkpoints)
    assert needed_keys("proxy-0", 2, 2, (0,)) == [
        "proxy-0.key_secret", "server-0.key", "worker-0.key", "worker-1.key"]
    with pytest.raises(ConfigError, match="no identity"):
        needed_keys("worker-01", 2, 2)


def test_a_server_admits_only_the_keys_whose_scope_includes_its_shard(tmp_path: Path) -> None:
    create_keys(tmp_path / "k", 2, 2, proxies=(0,))
    ring = KeyRing(tmp_path / "k")
    names = {s: sorted(i.name for i in ring.server_curve(s, 2).clients.values()) for s in (0, 1)}
    assert names == {0: ["evaluator", "proxy-0", "worker-0", "worker-1"],
                     1: ["evaluator", "worker-0", "worker-1"]}
    assert sorted(i.name for i in ring.front_curve(0, 2).clients.values()) == [
        "worker-0", "worker-1"]


def test_secrets_are_never_readable_by_others_not_even_while_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file is created under umask 077 (checked inside the writer), then the
    public ones are opened to 0644."""
    import zmq.auth

    seen: list[int] = []
    real = zmq.auth.create_certificates

    def spy(directory: str, name: str, *args, **kwargs):
        seen.append(os.umask(0o077))
        os.umask(seen[-1])
        return real(directory, name, *args, **kwargs)

    monkeypatch.setattr(zmq.auth, "create_certificates", spy)
    before = os.umask(0o022)
    try:
        names = create_keys(tmp_path / "k", 1, 2)
    finally:
        os.umask(before)
    assert seen == [0o077] * len(names) and names == key_names(1, 2)
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == 0o700
    for name in names:
        assert stat.S_IMODE((tmp_path / "k" / (name + SECRET_SUFFIX)).stat().st_mode) == 0o600
        assert stat.S_IMODE((tmp_path / "k" / (name + PUBLIC_SUFFIX)).stat().st_mode) == 0o644
    assert os.umask(0o022) == 0o022  # the process's umask is back


def test_a_key_directory_others_may_write_is_refused(tmp_path: Path) -> None:
    create_keys(tmp_path / "k", 1, 1)
    os.chmod(tmp_path / "k", 0o770)
    with pytest.raises(ConfigError, match="writable by its group"):
        KeyRing(tmp_path / "k")
    with pytest.raises(ConfigError, match="writable by its group"):
        create_keys(tmp_path / "k", 1, 1, force=True)


def test_a_secret_others_may_read_is_refused(tmp_path: Path) -> None:
    create_keys(tmp_path / "k", 1, 1)
    os.chmod(tmp_path / "k" / "worker-0.key_secret", 0o640)
    ring = KeyRing(tmp_path / "k")
    with pytest.raises(ConfigError, match="chmod 600"):
        ring.pair("worker-0")
    assert ring.pair("server-0")  # the others still load


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666], ids=oct)
def test_a_public_key_others_may_write_is_refused(tmp_path: Path, mode: int) -> None:
    """Anyone who could replace ``worker-0.key`` would be admitted as worker 0."""
    create_keys(tmp_path / "k", 1, 1)
    os.chmod(tmp_path / "k" / "worker-0.key", mode)
    ring = KeyRing(tmp_path / "k")
    with pytest.raises(ConfigError, match=f"public key .*worker-0.key is writable by its "
                                          f"group or by anyone \\(mode {mode:04o}\\): anyone "
                                          f"who can replace it is admitted as worker-0"):
        ring.server_curve(0, 1)
    assert ring.client_curve("worker-0", 0)  # its secret file (and server-0.key) still load


def _give_away(path: Path, uid: int = 65534) -> None:
    """chown ``path`` to another user (root only: skip the test otherwise)."""
    try:
        os.chown(path, uid, -1)
    except PermissionError:
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        raise


@pytest.mark.parametrize("name", ["worker-0.key", "worker-0.key_secret", "."])
def test_a_key_file_or_directory_another_user_owns_is_refused(tmp_path: Path,
                                                              name: str) -> None:
    create_keys(tmp_path / "k", 1, 1)
    _give_away(tmp_path / "k" / name)
    with pytest.raises(ConfigError, match="is owned by uid 65534, not by you"):
        _load_every_key(tmp_path / "k", key_names(1, 1))


def _load_every_key(directory: Path, names: list[str]) -> None:
    ring = KeyRing(directory)
    for name in names:
        ring.public(name)
        ring.pair(name)


def test_a_secret_key_that_is_a_symbolic_link_is_refused(tmp_path: Path) -> None:
    create_keys(tmp_path / "k", 1, 1)
    secret = tmp_path / "k" / "worker-0.key_secret"
    os.replace(secret, tmp_path / "elsewhere")
    secret.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match=r"worker-0\.key_secret is a symbolic link"):
        KeyRing(tmp_path / "k").pair("worker-0")


def test_a_public_key_link_is_checked_where_it_points(tmp_path: Path) -> None:
    """The file opened is the one checked, and the directories above it."""
    create_keys(tmp_path / "k", 1, 1)
    public = tmp_path / "k" / "worker-0.key"
    (tmp_path / "shared").mkdir()
    os.replace(public, tmp_path / "shared" / "w0.key")
    public.symlink_to(tmp_path / "shared" / "w0.key")
    assert KeyRing(tmp_path / "k").public("worker-0")
    os.chmod(tmp_path / "shared", 0o777)
    with pytest.raises(ConfigError, match="which anyone may write \\(mode 0777, no sticky"):
        KeyRing(tmp_path / "k").public("worker-0")
    os.chmod(tmp_path / "shared", 0o755)
    os.chmod(tmp_path / "shared" / "w0.key", 0o666)
    with pytest.raises(ConfigError, match="is writable by its group or by anyone"):
        KeyRing(tmp_path / "k").public("worker-0")


def test_a_parent_directory_anyone_may_write_is_refused_unless_sticky(tmp_path: Path) -> None:
    """Whoever may rename the key directory can swap in one of their own, whatever its
    modes; a sticky directory (like /tmp) lets only the owner rename its entries."""
    create_keys(tmp_path / "shared" / "run" / "k", 1, 1)
    os.chmod(tmp_path / "shared", 0o777)
    shared = re.escape(str(tmp_path / "shared"))
    for path in (tmp_path / "shared" / "run" / "k", tmp_path / "shared" / "run" / ".." / "run"
                 / "k"):
        with pytest.raises(ConfigError, match=f"lies in {shared}, which anyone may write "
                                              f"\\(mode 0777, no sticky bit\\)"):
            KeyRing(path)
    with pytest.raises(ConfigError, match="which anyone may write"):
        create_keys(tmp_path / "shared" / "run" / "k", 1, 1, force=True)
    os.chmod(tmp_path / "shared", 0o1777)  # and what ps-keys writes passes every check
    names = create_keys(tmp_path / "shared" / "run" / "k", 2, 2, proxies=(1,), force=True)
    _load_every_key(tmp_path / "shared" / "run" / "k", names)


def test_a_key_directory_reached_through_a_link_is_checked_where_it_lies(
        tmp_path: Path) -> None:
    create_keys(tmp_path / "open" / "k", 1, 1)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "k").symlink_to(tmp_path / "open" / "k")
    os.chmod(tmp_path / "open", 0o757)
    with pytest.raises(ConfigError, match=f"lies in {re.escape(str(tmp_path / 'open'))}, which"):
        KeyRing(tmp_path / "mine" / "k")


def test_a_parent_directory_another_user_owns_is_refused(tmp_path: Path) -> None:
    create_keys(tmp_path / "theirs" / "k", 1, 1)
    _give_away(tmp_path / "theirs")
    theirs = re.escape(str(tmp_path / "theirs"))
    with pytest.raises(ConfigError, match=f"lies in {theirs}, owned by uid 65534, not by you"):
        KeyRing(tmp_path / "theirs" / "k")

