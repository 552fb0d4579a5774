"""End-to-end tags on what a worker says to a server, so that a proxy carries only that.

A proxy (``ps-proxy``) sits between the workers and a server process and may change
the values of a push: that is the attack it exists for. CURVE authenticates each hop,
so the server sees the proxy's key, not the worker's, on everything relayed; the proxy
could otherwise open sessions for workers that never connected through it, or push
first for a round an honest worker had not yet sent (its own push then a "repeat").

So each worker tags, end to end, its HELLO and the header of each of its pushes with
a key only it and the server share: ``HMAC-SHA256`` under a key derived from the
X25519 agreement of the worker's CURVE secret key and the server's public key (the
server computes it from its secret key and the worker's public key; the proxy holds
neither secret). A HELLO's tag covers the run's hash, the worker id, the server
process and a nonce the worker draws for its session; a push's covers the run's hash,
the worker, the server, the round, the length, the wire dtype and that nonce. The
values are not covered (the proxy changes them), nor are ``pull_next`` and
``bare_params``, which shape only the replies, which the proxy controls anyway.

The server requires the tags on relayed messages (``server.core``); on a worker's own
connection CURVE already proves who speaks. X25519 is RFC 7748's Montgomery ladder in
Python: its inputs are the run's fixed keys (no peer chooses them), and each side
computes it once per (worker, server) pair.
"""

from __future__ import annotations

import hashlib
import hmac
import os

import zmq.utils.z85 as z85

_P = 2**255 - 19
_A24 = 121665
TAG_BYTES = 16
NONCE_BYTES = 16
_CONTEXT = b"ps-relay-auth-v1"


def x25519(scalar: bytes, u: bytes) -> bytes:
    """RFC 7748's X25519(scalar, u), 32 bytes each way."""
    k = bytearray(scalar)
    k[0] &= 248
    k[31] &= 127
    k[31] |= 64
    n = int.from_bytes(k, "little")
    x1 = int.from_bytes(u, "little") & ((1 << 255) - 1)
    x2, z2, x3, z3, swap = 1, 0, x1, 1, 0
    for t in reversed(range(255)):
        bit = (n >> t) & 1
        if swap ^ bit:
            x2, x3, z2, z3 = x3, x2, z3, z2
        swap = bit
        a, b = (x2 + z2) % _P, (x2 - z2) % _P
        aa, bb = a * a % _P, b * b % _P
        e = (aa - bb) % _P
        da, cb = (x3 - z3) * a % _P, (x3 + z3) * b % _P
        x3, z3 = (da + cb) ** 2 % _P, x1 * (da - cb) ** 2 % _P
        x2, z2 = aa * bb % _P, e * (aa + _A24 * e) % _P
    if swap:
        x2, z2 = x3, z3
    return (x2 * pow(z2, _P - 2, _P) % _P).to_bytes(32, "little")


def pair_key(own_secret: bytes, peer_public: bytes, worker_public: bytes,
             server_public: bytes) -> bytes:
    """The key a worker and a server share (each passes its own z85 secret key and the
    other's z85 public key; both pass the two public keys in the same order)."""
    shared = x25519(z85.decode(own_secret), z85.decode(peer_public))
    if not any(shared):
        raise ValueError("a low-order public key: no shared secret")
    return hmac.new(shared, _CONTEXT + b"|" + worker_public + b"|" + server_public,
                    hashlib.sha256).digest()


def new_nonce() -> str:
    """A session's nonce, drawn by the worker for each connection it opens."""
    return os.urandom(NONCE_BYTES).hex()


def hello_tag(key: bytes, config_hash: str, worker: int, server: int, nonce: str) -> str:
    """The tag of worker ``worker``'s HELLO to server process ``server``."""
    return _tag(key, "hello", config_hash, worker, server, nonce)


def push_tag(key: bytes, config_hash: str, worker: int, server: int, nonce: str,
             round_: int, length: int, dtype: str) -> str:
    """The tag of a push header of worker ``worker`` to server process ``server``."""
    return _tag(key, "push", config_hash, worker, server, nonce, round_, length, dtype)


def tags_equal(a: str, b: str) -> bool:
    """Constant-time comparison of two tags."""
    return hmac.compare_digest(a.encode(), b.encode())


def _tag(key: bytes, *fields: object) -> str:
    text = "|".join(str(f) for f in fields).encode()
    return hmac.new(key, text, hashlib.sha256).digest()[:TAG_BYTES].hex()
