"""End-to-end tags through a proxy (``common/net/relay_auth.py``): X25519 as RFC 7748
specifies it and as libsodium's CURVE keys agree, and a server core that refuses what a
proxy's key says for a worker without that worker's tag (issue 35's second row)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import zmq
import zmq.utils.z85 as z85

from common.net.keys import Identity, KeyRing, create_keys
from common.net.protocol import Ack, Error, ErrorCode, Hello, Push, Welcome, decode, encode
from common.net.relay_auth import hello_tag, new_nonce, pair_key, push_tag, x25519
from common.net.transport import Incoming
from server.sessions import RelayTags
from tests.unit.server.test_server_core import CFG5, grad, make_core, only

PROXY = Identity("proxy", 0)
CONNECTION = b"proxy-0-connection"


def test_x25519_matches_rfc_7748() -> None:
    scalar = bytes.fromhex("a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4")
    u = bytes.fromhex("e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c")
    assert x25519(scalar, u).hex() == (
        "c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552")
    alice = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
    bob_public = bytes.fromhex(
        "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
    assert x25519(alice, bob_public).hex() == (
        "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742")


def test_x25519_of_the_base_point_is_the_curve_public_key() -> None:
    for _ in range(5):
        public, secret = zmq.curve_keypair()
        assert z85.encode(x25519(z85.decode(secret), (9).to_bytes(32, "little"))) == public


def test_a_worker_and_a_server_derive_one_key_that_a_third_key_does_not() -> None:
    wp, ws = zmq.curve_keypair()
    sp, ss = zmq.curve_keypair()
    _, xs = zmq.curve_keypair()  # the proxy's
    key = pair_key(ws, sp, wp, sp)
    assert pair_key(ss, wp, wp, sp) == key
    assert pair_key(xs, sp, wp, sp) != key and pair_key(xs, wp, wp, sp) != key


@pytest.fixture(scope="module")
def ring(tmp_path_factory) -> KeyRing:
    directory = tmp_path_factory.mktemp("relay") / "keys"
    create_keys(directory, 2, 5, proxies=(0,))
    return KeyRing(directory)


def _core(ring: KeyRing):
    core = make_core(cfg=CFG5)
    core.relay = RelayTags(CFG5.config_hash, 0, lambda w: ring.server_relay_key(0, w))
    return core


def _relayed(header, tensor=None, route: bytes = b"worker-at-proxy") -> Incoming:
    frames = encode(header, tensor)
    envelope = [CONNECTION, route]
    return Incoming(envelope=envelope, message=decode(frames), error=None,
                    frames=[*envelope, b"", *frames], size=sum(len(f) for f in frames),
                    identity=PROXY)


def _hello(ring: KeyRing, worker: int, signer: int | None = None, server: int = 0,
           nonce: str | None = None) -> Hello:
    """Worker ``worker``'s HELLO tagged with the key of worker ``signer`` (default its own;
    None tags nothing)."""
    nonce = new_nonce() if nonce is None else nonce
    key = ring.worker_relay_key(worker if signer is None else signer, server)
    return Hello(role="worker", worker=worker, config_hash=CFG5.config_hash, nonce=nonce,
                 tag=hello_tag(key, CFG5.config_hash, worker, server, nonce))


def test_a_relayed_hello_needs_its_workers_tag(ring) -> None:
    core = _core(ring)
    bare = Hello(role="worker", worker=1, config_hash=CFG5.config_hash)
    forged = [bare, replace(bare, nonce=new_nonce(), tag="00" * 16),
              _hello(ring, 1, signer=2),  # another worker's key
              _hello(ring, 1, server=1),  # a tag for another server process
              replace(_hello(ring, 1), worker=3)]  # a tag of worker 1, claimed as 3
    for hello in forged:
        reply = only(core.handle(_relayed(hello), 0.0)).header
        assert isinstance(reply, Error) and reply.code == ErrorCode.FORBIDDEN.value, hello
    assert len(core.sessions) == 0
    assert isinstance(only(core.handle(_relayed(_hello(ring, 1)), 0.0)).header, Welcome)


def test_a_stolen_proxy_key_cannot_open_sessions_for_all_workers(ring) -> None:
    """Issue 35: proxy-0's key straight at server-0, made-up envelopes before the
    delimiter, HELLO as every worker and a push for each: all refused, nothing counted."""
    core = _core(ring)
    for w in range(5):
        hello = Hello(role="worker", worker=w, config_hash=CFG5.config_hash)
        route = b"made-up-%d" % w
        assert only(core.handle(_relayed(hello, route=route), 0.0)).header.code == "forbidden"
        values = np.full(5, 1e6, dtype=np.float32)
        push = Push(round=0, worker=w, length=5)
        reply = only(core.handle(_relayed(push, values, route=route), 0.0)).header
        assert reply.code in ("forbidden", "hello-first")
    assert core.state.pushes == 0 and len(core.sessions) == 0


def test_a_relayed_push_needs_its_workers_tag_for_this_session_and_round(ring) -> None:
    core = _core(ring)
    nonce = new_nonce()
    assert isinstance(only(core.handle(_relayed(_hello(ring, 2, nonce=nonce)), 0.0)).header,
                      Welcome)
    key = ring.worker_relay_key(2, 0)

    def tagged(round_: int, session: str = nonce, length: int = 5) -> Push:
        return Push(round=round_, worker=2, length=length,
                    tag=push_tag(key, CFG5.config_hash, 2, 0, session, round_, length,
                                 "float32"))

    for header in (Push(round=0, worker=2, length=5),
                   replace(tagged(1), round=0),  # a tag of another round
                   tagged(0, new_nonce()),  # of another session
                   replace(tagged(0, length=4), length=5)):
        reply = only(core.handle(_relayed(header, grad(2)), 0.0)).header
        assert isinstance(reply, Error) and reply.code == "forbidden", header
    assert core.state.pushes == 0
    # the worker's own header, with values the proxy changed: accepted (its job)
    corrupted = grad(2) * -1e20
    reply = only(core.handle(_relayed(tagged(0), corrupted), 0.0)).header
    assert reply == Ack(round=0, worker=2)


def test_a_direct_connection_needs_no_tag(ring) -> None:
    """CURVE already proves who speaks on a worker's own connection."""
    core = _core(ring)
    hello = Hello(role="worker", worker=4, config_hash=CFG5.config_hash)
    frames = encode(hello)
    incoming = Incoming(envelope=[b"w4"], message=decode(frames), error=None,
                        frames=[b"w4", b"", *frames], size=10, identity=Identity("worker", 4))
    assert isinstance(only(core.handle(incoming, 0.0)).header, Welcome)


def test_a_worker_tags_what_it_sends_through_keys(ring) -> None:
    """The worker's core: its HELLO and its push headers (first and repeated) carry the
    tags a server accepts from a proxy, for each server process its own."""
    from tests.unit.worker.test_worker_core import gradient, reply, welcome
    from worker.core import ClientCore

    cfg = CFG5
    client = ClientCore(cfg, "worker", 3, ["tcp://a:1", "tcp://b:1"],
                        auth=lambda server: ring.worker_relay_key(3, server))
    hellos = [decode(send.frames).header for send in client.hello(0.0)]
    assert hellos[0].nonce != hellos[1].nonce
    server = _core(ring)
    assert isinstance(only(server.handle(_relayed(hellos[0]), 0.0)).header, Welcome)
    other = _core(ring)  # server process 0's checker: a HELLO meant for process 1 fails
    assert only(other.handle(_relayed(hellos[1]), 0.0)).header.code == "forbidden"
    for s in (0, 1):
        client.handle(s, reply(replace(welcome(s), rounds=cfg.rounds)), 0.0)
    sends = client.push(0, np.resize(gradient(0), 10), 1.0)
    message = decode(sends[0].frames)
    assert message.header.tag
    assert message.header.pull_next  # answered with PARAMS(1) once the round closes
    assert server.handle(_relayed(message.header, message.tensor()), 1.0) == []
    assert server.state.counted(0, 3)


def test_refusals_through_a_proxy_are_budgeted_per_verified_worker_else_per_key(ring) -> None:
    """One worker behind a proxy, or envelopes the key holder makes up, cannot spend the
    answers another verified worker behind it needs."""
    from common.net.budgets import REFUSAL_BURST

    core = _core(ring)
    for w, route in ((1, b"route-1"), (2, b"route-2")):
        assert isinstance(only(core.handle(_relayed(_hello(ring, w), route=route), 0.0)).header,
                          Welcome)
    untagged = Push(round=0, worker=1, length=5)
    answered = sum(len(core.handle(_relayed(untagged, grad(1), route=b"route-1"), 0.0))
                   for _ in range(int(REFUSAL_BURST) + 50))
    assert answered == int(REFUSAL_BURST)  # worker 1's budget, spent
    made_up = Hello(role="worker", worker=3, config_hash=CFG5.config_hash)
    answered = sum(len(core.handle(_relayed(made_up, route=b"made-up-%d" % i), 0.0))
                   for i in range(int(REFUSAL_BURST) + 50))
    assert answered == int(REFUSAL_BURST)  # the proxy key's own budget, spent
    reply = only(core.handle(_relayed(Push(round=0, worker=2, length=5), grad(2),
                                      route=b"route-2"), 0.0)).header
    assert reply.code == "forbidden"  # worker 2 is still answered


def test_a_worker_tags_only_what_a_proxy_relays(ring) -> None:
    """A direct link's CURVE key says who speaks: its messages stay untagged (and older
    protocol-3 servers read them); the link through a proxy is tagged."""
    from worker.client import relay_keys
    from worker.core import ClientCore

    keys = relay_keys(ring, "worker", 3, via_proxy=(0,))
    assert keys is not None and keys(1) is None and keys(0) == ring.worker_relay_key(3, 0)
    assert relay_keys(None, "worker", 3, (0,)) is None
    assert relay_keys(ring, "evaluator", -1, (0,)) is None
    client = ClientCore(CFG5, "worker", 3, ["tcp://a:1", "tcp://b:1"], auth=keys)
    through_proxy, direct = (decode(send.frames).header for send in client.hello(0.0))
    assert through_proxy.tag and not direct.tag and not direct.nonce
