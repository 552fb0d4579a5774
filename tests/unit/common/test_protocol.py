"""Wire protocol: every message round-trips; every malformed input raises ProtocolError."""

from __future__ import annotations

import contextlib

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.net.protocol import (
    CHUNK_BYTES,
    MAX_HEADER_BYTES,
    PROTOCOL_VERSION,
    Ack,
    Error,
    Hello,
    Op,
    Params,
    ProtocolError,
    Pull,
    Push,
    Status,
    StatusReply,
    Welcome,
    decode,
    encode,
    join_envelope,
    reheaded,
    split_envelope,
)

HEADERS = [
    Hello(role="worker", worker=3, config_hash="0123456789abcdef", config={"rule": "marmed"}),
    Welcome(shards=[1, 2], num_shards=4, d=40, length=20, round=7, rounds=500),
    Pull(round=5, worker=2),
    Ack(round=5, worker=2),
    Status(),
    StatusReply(shards=[0], round=3, rounds=10, finished=False, pushes=[0, 2], counters={"dup": 1}),
    Error(code="duplicate", message="worker 2 already pushed round 5", round=5),
]


def _bytes(frames) -> list[bytes]:
    return [bytes(f) for f in frames]


@pytest.mark.parametrize("header", HEADERS, ids=lambda h: type(h).__name__)
def test_headers_round_trip(header) -> None:
    msg = decode(_bytes(encode(header)))
    assert msg.header == header
    assert msg.chunks == ()


@pytest.mark.parametrize("length", [1, 7, 1000, CHUNK_BYTES // 4 + 3])
@pytest.mark.parametrize("kind", ["push", "params"])
def test_tensor_messages_round_trip(kind: str, length: int) -> None:
    values = np.random.default_rng(length).standard_normal(length).astype(np.float32)
    header = (
        Push(round=2, worker=1, length=length)
        if kind == "push"
        else Params(round=2, shards=[0], length=length)
    )
    frames = encode(header, values)
    assert len(frames) == 1 + -(-length * 4 // CHUNK_BYTES)  # chunked, header first
    msg = decode(_bytes(frames))
    assert msg.header == header
    np.testing.assert_array_equal(msg.tensor(), values)
    out = np.empty(length, dtype=np.float32)
    msg.tensor_into(out)
    np.testing.assert_array_equal(out, values)


def test_single_frame_decode_is_zero_copy() -> None:
    values = np.arange(16, dtype=np.float32)
    frames = _bytes(encode(Push(round=0, worker=0, length=16), values))
    msg = decode(frames)
    assert np.shares_memory(msg.tensor(), np.frombuffer(frames[1], dtype=np.uint8))


def test_non_finite_values_travel_unchanged() -> None:
    values = np.array([np.nan, np.inf, -np.inf, -1e20, 0.0], dtype=np.float32)
    msg = decode(_bytes(encode(Push(round=0, worker=0, length=5), values)))
    np.testing.assert_array_equal(msg.tensor().view(np.uint32), values.view(np.uint32))


def _header(**body) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


MALFORMED = {
    "empty": [],
    "garbage header": [b"\xc1\xff\x00garbage"],
    "not a map": [msgpack.packb([1, 2, 3])],
    "no version": [_header(op=int(Op.STATUS))],
    "wrong version": [_header(v=PROTOCOL_VERSION + 1, op=int(Op.STATUS))],
    "unknown op": [_header(v=PROTOCOL_VERSION, op=99)],
    "op not an int": [_header(v=PROTOCOL_VERSION, op="PUSH")],
    "op a bool": [_header(v=PROTOCOL_VERSION, op=True)],
    "op a float": [_header(v=PROTOCOL_VERSION, op=float(Op.STATUS))],
    "op a list": [_header(v=PROTOCOL_VERSION, op=[int(Op.STATUS)])],
    "missing field": [_header(v=PROTOCOL_VERSION, op=int(Op.PULL))],
    "unknown field": [_header(v=PROTOCOL_VERSION, op=int(Op.PULL), round=1, worker=0, x=1)],
    "wrong type": [_header(v=PROTOCOL_VERSION, op=int(Op.PULL), round="1", worker=0)],
    "bool for int": [_header(v=PROTOCOL_VERSION, op=int(Op.PULL), round=True, worker=0)],
    "payload too short": [
        _header(v=PROTOCOL_VERSION, op=int(Op.PUSH), round=0, worker=0, length=4),
        b"\x00" * 12,
    ],
    "payload too long": [
        _header(v=PROTOCOL_VERSION, op=int(Op.PUSH), round=0, worker=0, length=1),
        b"\x00" * 8,
    ],
    "no payload": [_header(v=PROTOCOL_VERSION, op=int(Op.PUSH), round=0, worker=0, length=1)],
    "zero length": [
        _header(v=PROTOCOL_VERSION, op=int(Op.PUSH), round=0, worker=0, length=0), b""
    ],
    "negative length": [
        _header(v=PROTOCOL_VERSION, op=int(Op.PUSH), round=0, worker=0, length=-1), b""
    ],
    "oversize length": [
        _header(v=PROTOCOL_VERSION, op=int(Op.PUSH), round=0, worker=0, length=1 << 40),
        b"\x00" * 4,
    ],
    "oversize chunk": [
        _header(v=PROTOCOL_VERSION, op=int(Op.PUSH), round=0, worker=0,
                length=CHUNK_BYTES // 4 + 1),
        b"\x00" * (CHUNK_BYTES + 4),
    ],
    "tensor on a pull": [_header(v=PROTOCOL_VERSION, op=int(Op.PULL), round=0, worker=0), b"x"],
    "frames after a bare params": [
        _header(v=PROTOCOL_VERSION, op=int(Op.PARAMS), round=1, shards=[0], length=1, bare=True),
        b"\x00" * 4,
    ],
    "bare params of no values": [
        _header(v=PROTOCOL_VERSION, op=int(Op.PARAMS), round=1, shards=[0], length=0, bare=True),
    ],
    "bare params of too many values": [
        _header(v=PROTOCOL_VERSION, op=int(Op.PARAMS), round=1, shards=[0], length=1 << 40,
                bare=True),
    ],
    "bare not a bool": [
        _header(v=PROTOCOL_VERSION, op=int(Op.PARAMS), round=1, shards=[0], length=1, bare=1),
        b"\x00" * 4,
    ],
    "bare_params not a bool": [
        _header(v=PROTOCOL_VERSION, op=int(Op.PUSH), round=0, worker=0, length=1,
                pull_next=True, bare_params=1),
        b"\x00" * 4,
    ],
    "version 2 (before bare params)": [_header(v=2, op=int(Op.PULL), round=0, worker=0)],
    "oversize header": [b"\x00" * (MAX_HEADER_BYTES + 1)],
    "list of strings for pushes": [
        _header(v=PROTOCOL_VERSION, op=int(Op.STATUS_REPLY), shards=[0], round=0, rounds=1,
                finished=False, pushes=["a"], counters={})
    ],
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_messages_raise_protocol_error(name: str) -> None:
    with pytest.raises(ProtocolError):
        decode(MALFORMED[name])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), min_size=1, max_size=4))
def test_random_garbage_never_raises_anything_but_protocol_error(frames: list[bytes]) -> None:
    with contextlib.suppress(ProtocolError):
        decode(frames)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["v", "op", "round", "worker", "length", "role", "config", "x"]),
        st.one_of(st.integers(-(2**63), 2**64 - 1), st.text(max_size=8), st.booleans(),
                  st.none(), st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3)),
    ),
    st.lists(st.binary(max_size=16), max_size=2),
)
def test_random_headers_never_raise_anything_but_protocol_error(body, payload) -> None:
    with contextlib.suppress(ProtocolError):
        decode([msgpack.packb(body), *payload])


def test_envelope_split_and_join() -> None:
    frames = join_envelope([b"proxy", b"worker"], [b"header", b"data"])
    assert frames == [b"proxy", b"worker", b"", b"header", b"data"]
    envelope, body = split_envelope(frames)
    assert envelope == [b"proxy", b"worker"] and body == [b"header", b"data"]
    with pytest.raises(ProtocolError):
        split_envelope([b"id", b"header"])


def test_encode_checks_the_tensor() -> None:
    with pytest.raises(ValueError):
        encode(Push(round=0, worker=0, length=3), np.zeros(4, dtype=np.float32))
    with pytest.raises(ValueError):
        encode(Push(round=0, worker=0, length=3))
    with pytest.raises(ValueError):
        encode(Pull(round=0, worker=0), np.zeros(1, dtype=np.float32))


def _hello_with_config(config: object) -> bytes:
    return msgpack.packb({"v": PROTOCOL_VERSION, "op": int(Op.HELLO), "role": "worker",
                          "worker": 0, "config_hash": "0" * 16, "config": config})


@pytest.mark.parametrize(("config", "what"), [
    ({f"k{i}": i for i in range(7000)}, "map"),  # 7,000 entries, 61 KB: under the size cap
    ({"k": "x" * 5000}, "string"),
    ({"k": b"\0" * 10}, "bin"),
], ids=["7000-entry-map", "5000-char-string", "bytes"])
def test_headers_holding_oversized_containers_are_refused_while_decoding(config, what) -> None:
    """msgpack's own bounds refuse them before any Python object is built for them
    (a 7,000-entry map used to cost a shard's thread up to 29 ms)."""
    raw = _hello_with_config(config)
    assert len(raw) <= MAX_HEADER_BYTES  # (arrays: the size cap bounds them, 64K entries)
    with pytest.raises(ProtocolError, match="undecodable header"):
        decode([raw])


def test_a_hello_with_the_runs_own_settings_still_decodes() -> None:
    from common.run.config import RunConfig

    cfg = RunConfig().validate()
    header = Hello(role="worker", worker=0, config_hash=cfg.config_hash, config=cfg.to_dict())
    assert decode(encode(header)).header == header


def test_a_reheaded_push_shares_the_payload_and_refuses_another_length() -> None:
    values = np.arange(10, dtype=np.float32)
    frames = encode(Push(round=3, worker=1, length=10, pull_next=True), values)
    again = reheaded(frames, Push(round=3, worker=1, length=10))
    assert all(a is b for a, b in zip(again[1:], frames[1:], strict=True))
    message = decode(again)
    assert message.header == Push(round=3, worker=1, length=10, pull_next=False)
    np.testing.assert_array_equal(message.tensor(), values)
    with pytest.raises(ValueError, match="cannot take a payload of 40 bytes"):
        reheaded(frames, Push(round=3, worker=1, length=11))


# -- bare PARAMS ---------------------------------------------------------------------


def test_a_push_asking_for_bare_params_round_trips() -> None:
    values = np.arange(3, dtype=np.float32)
    header = Push(round=4, worker=2, length=3, pull_next=True, bare_params=True)
    message = decode(_bytes(encode(header, values)))
    assert message.header == header and message.header.bare_params
    np.testing.assert_array_equal(message.tensor(), values)
    plain = decode(_bytes(encode(Push(round=4, worker=2, length=3), values))).header
    assert not plain.bare_params and not plain.pull_next  # the defaults


def test_a_bare_params_is_its_header_alone_and_still_states_the_length() -> None:
    header = Params(round=3, shards=[1, 2], length=20, bare=True)
    frames = encode(header)
    assert len(frames) == 1
    message = decode(_bytes(frames))
    assert message.header == header and message.header.length == 20
    assert message.chunks == ()
    full = decode(_bytes(encode(Params(round=3, shards=[0], length=1),
                                np.ones(1, dtype=np.float32)))).header
    assert not full.bare  # the default


def test_encode_refuses_a_tensor_for_a_bare_params() -> None:
    with pytest.raises(ValueError, match="a bare PARAMS carries no tensor"):
        encode(Params(round=3, shards=[0], length=2, bare=True), np.zeros(2, dtype=np.float32))
    with pytest.raises(ValueError, match="PARAMS needs a tensor"):
        encode(Params(round=3, shards=[0], length=2))  # a full one still needs it


def test_decode_refuses_extra_frames_after_a_bare_params() -> None:
    frames = [_header(v=PROTOCOL_VERSION, op=int(Op.PARAMS), round=3, shards=[0], length=2,
                      bare=True), b"\x00" * 8]
    with pytest.raises(ProtocolError, match="a bare PARAMS carries no tensor but 1 extra"):
        decode(frames)


def test_the_tensor_of_a_bare_params_is_a_value_error() -> None:
    message = decode(_bytes(encode(Params(round=3, shards=[0], length=2, bare=True))))
    with pytest.raises(ValueError, match="a bare PARAMS carries no values"):
        message.tensor()


def test_a_bare_params_header_cannot_take_a_payload() -> None:
    frames = encode(Params(round=3, shards=[0], length=2), np.zeros(2, dtype=np.float32))
    with pytest.raises(ValueError, match="cannot take a payload of 8 bytes"):
        reheaded(frames, Params(round=3, shards=[0], length=2, bare=True))
