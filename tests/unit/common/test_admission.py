"""Who the ZAP handler admits, on a fake clock: scope, bars, connections, handshake rate."""

from __future__ import annotations

from common.net.admission import Admission
from common.net.budgets import LogThrottle, RateLimit, excerpt, peer_repr, principal_name
from common.net.keys import Identity

W1, W2 = Identity("worker", 1), Identity("worker", 2)
CLIENTS = {b"key-1": W1, b"key-2": W2}


def test_only_the_nodes_clients_are_admitted() -> None:
    admission = Admission(CLIENTS)
    assert admission.admit(b"key-1", 0.0).admitted
    decision = admission.admit(b"stranger", 0.0)
    assert not decision.admitted and decision.identity is None


def test_a_barred_key_is_refused_for_good_the_others_not() -> None:
    admission = Admission(CLIENTS)
    assert admission.bar(W1, "over-long message") and not admission.bar(W1, "again")
    decision = admission.admit(b"key-1", 1e6)
    assert not decision.admitted and "over-long" in decision.reason
    assert admission.admit(b"key-2", 0.0).admitted
    assert admission.refused["barred"] == 1


def test_a_key_holds_at_most_its_connections_counting_those_not_yet_named() -> None:
    """Handshakes count as connections until a message names them (pending_s), then
    the guard's count of attributed connections (``live``) does."""
    live = {W1: 0}
    admission = Admission(CLIENTS, max_connections=2, max_handshakes=100, pending_s=10.0)
    admission.live = lambda identity: live.get(identity, 0)
    assert admission.admit(b"key-1", 0.0).admitted and admission.admit(b"key-1", 0.1).admitted
    decision = admission.admit(b"key-1", 0.2)  # two handshakes, no message yet
    assert not decision.admitted and "2 connections" in decision.reason
    assert admission.admit(b"key-2", 0.2).admitted  # per key
    live[W1] = 2  # both named by a message: still two
    assert not admission.admit(b"key-1", 10.5).admitted
    live[W1] = 1  # one closed
    assert admission.admit(b"key-1", 10.6).admitted
    assert admission.refused["connections"] == 2


def test_a_named_connection_counts_once_and_a_closed_one_not_at_all() -> None:
    """A worker that reopens its socket on every request timeout (each new connection
    named by its first message, the old one closed) is never refused, however often
    it reopens within the window; unnamed handshakes still count."""
    live = {W1: 0}
    admission = Admission(CLIENTS, max_connections=2, max_handshakes=100, pending_s=10.0)
    admission.live = lambda identity: live.get(identity, 0)
    for i in range(6):  # one reopen every 1.5 s: the old connection closed, the new named
        now = 1.5 * i
        assert admission.admit(b"key-1", now).admitted, f"reopen {i} refused"
        admission.named(W1, now + 0.01)
        live[W1] = 1
    assert admission.admit(b"key-1", 9.0).admitted  # one live + one unnamed: two
    assert not admission.admit(b"key-1", 9.1).admitted
    admission.named(W2, 9.2)  # another key's message names nothing of key-1's
    assert not admission.admit(b"key-1", 9.3).admitted
    # a connection named only after its handshake stopped counting (a slow node) takes
    # nothing from the newer, unnamed one
    admission.named(W1, 9.4, age_s=10.5)
    assert not admission.admit(b"key-1", 9.5).admitted


def test_a_rate_limit_gives_the_burst_then_the_rate() -> None:
    limit = RateLimit(rate=10.0, burst=5.0)
    assert [limit.allow("k", 0.0) for _ in range(7)] == [True] * 5 + [False] * 2
    assert limit.allow("k", 0.1) and not limit.allow("k", 0.1)
    assert limit.allow("other", 0.1)


def test_budget_tables_forget_the_least_recently_used_principal() -> None:
    limit = RateLimit(rate=1.0, burst=1.0, limit=2)
    throttle = LogThrottle(interval_s=10.0, limit=2)
    for i in range(1000):  # a stream of new connections without keys
        limit.allow(b"conn-%d" % i, 0.0)
        throttle.admit(b"conn-%d" % i, 0.0)
    assert len(limit._buckets) == 2 and len(throttle._last) == 2


def test_a_log_throttle_says_how_many_lines_it_held_back() -> None:
    throttle = LogThrottle(interval_s=10.0)
    assert throttle.admit("k", 0.0) == 0
    assert [throttle.admit("k", t) for t in (1.0, 2.0, 9.9)] == [None, None, None]
    assert throttle.admit("k", 10.0) == 3


def test_an_excerpt_of_a_peers_text_is_short_and_says_how_long_it_was() -> None:
    assert excerpt("abc") == "abc"
    cut = excerpt("x" * 260_000)
    assert len(cut) < 240 and "260,000 characters" in cut
    assert principal_name(b"\xff" * 20) == "connection " + "ff" * 8


def test_an_excerpt_is_one_line_its_unprintable_characters_escaped() -> None:
    assert excerpt("a\nb\r\x1b[31mc\u202ed\x00") == "a\\nb\\r\\x1b[31mc\\u202ed\\x00"
    assert excerpt("été, 1 ± 2") == "été, 1 ± 2"  # printable text as it is
    cut = excerpt("\n" * 300)
    assert cut == "\\n" * 100 + "... (300 characters)"  # 200 characters shown, escaped
    assert excerpt("\x00" * 50, 20) == "\\x00" * 5 + "... (50 characters)"


def test_a_peers_value_is_shown_however_deep_it_nests() -> None:
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    assert peer_repr(deep) == "[[[[...]]]]"
    assert peer_repr("a\nb") == "'a\\nb'"
    assert len(peer_repr(list(range(10**6)))) < 60


def test_the_bounds_before_a_handshake_leave_room_for_a_local_clusters_workers() -> None:
    """All of a local cluster's n workers connect from one address at once, and each may
    reconnect while its old connection lingers."""
    from common.net.inflight import MAX_BARE, MAX_BARE_PER_SOURCE, bare_bounds

    assert bare_bounds(0) == (MAX_BARE_PER_SOURCE, MAX_BARE)
    per_source, in_all = bare_bounds(100)
    assert per_source >= 2 * 100 and in_all >= 4 * 100 and in_all > per_source
