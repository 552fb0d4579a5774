"""Key files: canonical names, scopes, what each process loads, modes from the first byte."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from common.errors import ConfigError
from common.keys import (
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
        "worker-1.key_secret", "server-0.key", "server-1.key"]
    assert needed_keys("server-0", 2, 2, (0,)) == [
        "server-0.key_secret", "worker-0.key", "worker-1.key", "evaluator.key", "proxy-0.key"]
    assert needed_keys("server-1", 2, 2, (0,)) == [
        "server-1.key_secret", "worker-0.key", "worker-1.key", "evaluator.key"]
    assert needed_keys("proxy-0", 2, 2, (0,)) == [
        "proxy-0.key_secret", "server-0.key_secret", "server-0.key", "worker-0.key",
        "worker-1.key"]
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
