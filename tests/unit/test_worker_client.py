"""Room for a worker process's links: ZeroMQ's socket cap and the open-file limit are
raised before a process of many workers opens its connections (100 workers x 20 server
processes are 2,000 links: past the default cap of 1,023 sockets), and a hard limit too
low for them is a configuration error naming the remedy."""

from __future__ import annotations

import resource

import pytest
import zmq

from common.errors import ConfigError
from worker import client


def test_the_socket_cap_and_the_open_file_limit_are_raised_for_many_links(
        monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (1024, 100_000))
    monkeypatch.setattr(resource, "setrlimit", lambda which, limits: calls.append(limits))
    client.reserve_links(2000)
    assert zmq.Context.instance().get(zmq.MAX_SOCKETS) >= 3 * 2000
    assert calls == [(4 * 2000 + 256, 100_000)]


def test_enough_room_already_changes_nothing(monkeypatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (20_000, 20_000))
    monkeypatch.setattr(resource, "setrlimit", lambda *_: pytest.fail("raised needlessly"))
    client.reserve_links(10)


def test_a_hard_limit_too_low_is_a_configuration_error(monkeypatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (1024, 4096))
    with pytest.raises(ConfigError, match=r"2000 connections need about 8256 open files, "
                       r"and this process may open 4096 \(ulimit -n\): run the workers in "
                       r"more processes \(--worker-processes\)"):
        client.reserve_links(2000)
