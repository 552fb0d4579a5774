"""bfloat16 on the wire (``common/net/wire.py``, ``--wire-dtype``): the rounding, the exact
widening, a PUSH's frames both ways, and the refusals of what does not fit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.net.protocol import (
    CHUNK_BYTES,
    ErrorCode,
    ProtocolError,
    Push,
    Refused,
    decode,
    encode,
    reheaded,
)
from common.net.pushes import PushWindow, check_push
from common.net.wire import (
    BFLOAT16,
    FLOAT32,
    from_bfloat16,
    round_to_wire,
    to_bfloat16,
    to_wire,
)

SPECIAL = np.array([1.0, 1.00390625, 1.01171875, 1.0078125, -1e20, np.inf, -np.inf, np.nan,
                    3.4e38, 1e-40, -0.0, 0.0, 65504.0, -2.5e-3], dtype=np.float32)


def test_rounding_is_to_nearest_even_as_torch_converts() -> None:
    values = np.concatenate([SPECIAL, np.random.default_rng(0).standard_normal(
        10_000).astype(np.float32) * np.float32(1e3)])
    bits = to_bfloat16(values)
    expected = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy()
    assert bits.dtype == np.uint16 and np.array_equal(bits.view(np.int16), expected)
    assert bits[1] == 0x3F80  # 1 + 2^-8: a tie, to the even 1.0
    assert bits[3] == 0x3F81  # 1 + 2^-7: representable, kept
    widened = from_bfloat16(bits, np.empty_like(values))
    assert np.array_equal(widened.view(np.uint32) & 0xFFFF, np.zeros(values.size, np.uint32))
    assert np.array_equal(np.isnan(widened), np.isnan(values))  # a NaN stays a NaN
    assert widened[5] == np.inf and widened[6] == -np.inf and widened[8] == np.inf
    assert widened[4] < -9e19  # the gambler's factor keeps its range
    normal = (np.abs(values) > 1e-37) & (np.abs(values) < 1e38)  # 8 bits of mantissa
    np.testing.assert_allclose(widened[normal], values[normal], rtol=2 ** -8)


def test_rounding_twice_changes_nothing_and_float32_is_left_alone() -> None:
    once = round_to_wire(SPECIAL, BFLOAT16)
    assert np.array_equal(round_to_wire(once, BFLOAT16), once, equal_nan=True)
    assert round_to_wire(SPECIAL, FLOAT32) is SPECIAL
    assert to_wire(SPECIAL, FLOAT32) is SPECIAL
    out = np.empty(SPECIAL.size, dtype=np.uint16)
    assert to_wire(SPECIAL, BFLOAT16, out) is out


def test_a_bfloat16_push_round_trips_from_bits_without_a_copy() -> None:
    values = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    bits = to_bfloat16(values)
    header = Push(round=3, worker=2, length=1000, pull_next=True, dtype=BFLOAT16)
    frames = encode(header, [bits[:400], bits[400:]])
    assert sum(memoryview(f).nbytes for f in frames[1:]) == 2000  # half of float32's
    assert np.shares_memory(np.frombuffer(frames[1], dtype=np.uint16), bits)
    msg = decode(frames)
    assert msg.header == header
    np.testing.assert_array_equal(msg.tensor(), round_to_wire(values, BFLOAT16))
    a, b = np.empty(300, dtype=np.float32), np.empty(700, dtype=np.float32)
    msg.tensor_into(a, b)
    np.testing.assert_array_equal(np.concatenate([a, b]), round_to_wire(values, BFLOAT16))
    again = decode(reheaded(frames, Push(round=3, worker=2, length=1000, dtype=BFLOAT16)))
    np.testing.assert_array_equal(again.tensor(), msg.tensor())


def test_float32_values_for_a_bfloat16_push_are_rounded_when_encoded() -> None:
    """What a proxy forwards after corrupting the decoded values."""
    values = SPECIAL.copy()
    msg = decode(encode(Push(round=0, worker=0, length=values.size, dtype=BFLOAT16),
                        values))
    np.testing.assert_array_equal(msg.tensor(), round_to_wire(values, BFLOAT16))


def test_widening_crosses_chunks_and_destinations() -> None:
    """A push larger than one frame: chunks of CHUNK_BYTES, widened into each shard's row
    whatever the boundaries."""
    n = CHUNK_BYTES // 2 + 1234  # two chunks
    values = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    frames = encode(Push(round=0, worker=0, length=n, dtype=BFLOAT16), to_bfloat16(values))
    assert len(frames) == 3
    outs = [np.empty(k, dtype=np.float32) for k in (5, n - 1000, 995)]
    decode(frames).tensor_into(*outs)
    np.testing.assert_array_equal(np.concatenate(outs), round_to_wire(values, BFLOAT16))
    with pytest.raises(ProtocolError, match="destination needs"):
        decode(frames).tensor_into(np.empty(n - 1, dtype=np.float32))


def test_a_payload_that_does_not_match_its_dtype_is_malformed() -> None:
    header = Push(round=0, worker=0, length=10, dtype=BFLOAT16)
    float32_frames = encode(Push(round=0, worker=0, length=10), np.zeros(10, np.float32))
    with pytest.raises(ProtocolError, match="announces 10 bfloat16 \\(20 bytes\\)"):
        decode(reheaded_unchecked(header, float32_frames[1:]))
    with pytest.raises(ProtocolError, match="splits a value of 2 bytes"):
        decode(reheaded_unchecked(header, [b"\0" * 7, b"\0" * 13]))
    with pytest.raises(ProtocolError, match="splits a value of 4 bytes"):  # float32 too
        decode(reheaded_unchecked(Push(round=0, worker=0, length=5, dtype=FLOAT32),
                                  [b"\0" * 6, b"\0" * 14]))
    with pytest.raises(ProtocolError, match="dtype 'float16' is none of float32, bfloat16"):
        decode(reheaded_unchecked(Push(round=0, worker=0, length=10, dtype="float16"),
                                  [b"\0" * 20]))


def reheaded_unchecked(header: Push, payload: list) -> list:
    """``header``'s frame before ``payload``, whatever it holds (what a hostile peer may
    send: ``encode`` checks what it encodes)."""
    import msgpack

    return [msgpack.packb({"v": 3, "op": int(header.op), "round": header.round,
                           "worker": header.worker, "length": header.length,
                           "dtype": header.dtype}), *payload]


def test_a_push_of_another_dtype_than_the_run_s_is_refused() -> None:
    window = PushWindow(workers=4, rounds=10, size=100, current=2, oldest=2, newest=2,
                        dtype=BFLOAT16)
    check_push(window, 2, 1, 100, dtype=BFLOAT16)
    with pytest.raises(Refused) as refused:
        check_push(window, 2, 1, 100, dtype=FLOAT32)
    assert refused.value.code == ErrorCode.WRONG_DTYPE
    assert "--wire-dtype is bfloat16" in str(refused.value)


def test_a_float32_push_header_is_what_protocol_3_peers_read() -> None:
    """``dtype`` is sent only for bfloat16: a float32 PUSH's header has the fields it had
    before the field existed (a peer of before refuses unknown fields)."""
    import msgpack

    def fields(header: Push) -> set:
        return set(msgpack.unpackb(encode(header, np.zeros(4, np.float32))[0]))

    assert fields(Push(round=1, worker=2, length=4)) == {
        "v", "op", "round", "worker", "length", "pull_next", "bare_params"}
    assert "dtype" in fields(Push(round=1, worker=2, length=4, dtype=BFLOAT16))
    assert decode(encode(Push(round=1, worker=2, length=4), np.zeros(4, np.float32))
                  ).header.dtype == FLOAT32


def test_a_bfloat16_push_in_many_small_chunks_costs_a_few_microseconds_each() -> None:
    """A hostile sender may split a push into as many frames as its size allows: each
    chunk is widened with one numpy call (no per-call set-up: a thousand small chunks
    take milliseconds, and the server's budget for a bfloat16 push leaves room for about
    a thousand more frames than it needs)."""
    import time

    values = np.random.default_rng(3).standard_normal(2000 * 8).astype(np.float32)
    bits = to_bfloat16(values)
    chunks = [memoryview(bits[i:i + 8]).cast("B") for i in range(0, bits.size, 8)]
    frames = [reheaded_unchecked(Push(round=0, worker=0, length=bits.size,
                                      dtype=BFLOAT16), [])[0], *chunks]
    msg = decode(frames)
    out = np.empty(bits.size, dtype=np.float32)
    started = time.perf_counter()
    msg.tensor_into(out)
    assert time.perf_counter() - started < 1.0  # about 10 ms for 2,000 chunks here
    np.testing.assert_array_equal(out, round_to_wire(values, BFLOAT16))


def test_a_push_is_sized_by_its_wire_dtype_at_the_server() -> None:
    """What the server and a proxy's front take as the largest legal push: 2 bytes a
    value with bfloat16, so a bfloat16 push has no float32-sized budget to spend on
    frames."""
    from common.net.transport import largest_message

    n = 10_000_000
    assert 2 * n < largest_message(n, 2) < 2 * n + 100_000 < largest_message(n) - 1.9 * n
