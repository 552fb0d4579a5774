"""Wire protocol between workers, servers, proxies and evaluators.

A message is a list of ZeroMQ frames::

    [msgpack header, raw tensor chunk, raw tensor chunk, ...]

The header is a msgpack map with the protocol version ``v``, the ``op`` code
and the op's fields; tensors never travel inside msgpack and nothing is ever
pickled. A tensor is little-endian float32 (a PUSH's may be bfloat16, its ``dtype``:
``common/net/wire.py``), sent as one or more raw frames of
at most ``CHUNK_BYTES`` each (measured: frames above about 32 MB are slow, as each
large allocation is a fresh mmap in glibc); the header states the element count and dtype and
the decoder checks that the frames hold exactly that many bytes.

On a server the ROUTER socket sees ``[routing envelope..., b"", header,
chunks...]``: the empty delimiter frame separates the opaque envelope (one
identity per hop, so the same server works directly and behind ``ps-proxy``)
from the message. ``split_envelope``/``join_envelope`` handle that part.

Every decoder raises ``ProtocolError`` (never anything else) for malformed
input: unknown op, wrong version, missing or mistyped fields, payload length
not matching the header, oversize data, a header over ``MAX_HEADER_BYTES`` or holding a
string, map or array longer than its bound (checked by msgpack as it decodes).
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, TypeGuard, cast

import msgpack
import numpy as np

from common.net.wire import BFLOAT16, FLOAT32, NUMPY_DTYPES, WIRE_DTYPES, from_bfloat16, to_bfloat16
from common.net.wire import ITEM_BYTES as WIRE_ITEM_BYTES

PROTOCOL_VERSION = 3
DTYPE = "<f4"
ITEM_BYTES = 4
CHUNK_BYTES = 4 * 1024 * 1024
MAX_HEADER_BYTES = 64 * 1024
MAX_ELEMENTS = 1 << 28
# Bounds of what a header may hold, checked while msgpack decodes it (so a peer's
# 7,000-entry map costs nothing): the longest string is an ERROR's message (2,000
# characters), the largest map a HELLO's settings or a STATUS reply's counters, the
# longest array a STATUS reply's list of the workers that pushed.
MAX_HEADER_STRING = 4096
MAX_HEADER_MAP = 64
MAX_HEADER_ARRAY = 1 << 16
_UNPACK_LIMITS = {"max_str_len": MAX_HEADER_STRING, "max_bin_len": 0,
                  "max_array_len": MAX_HEADER_ARRAY, "max_map_len": MAX_HEADER_MAP,
                  "max_ext_len": 0}
# Largest single inbound frame a socket accepts (zmq.MAXMSGSIZE): a chunk or a header.
MAX_FRAME_BYTES = max(CHUNK_BYTES, MAX_HEADER_BYTES)

Buffer = bytes | bytearray | memoryview


class Op(enum.IntEnum):
    """Operation codes carried in every header."""

    HELLO = 1
    WELCOME = 2
    PULL = 3
    PARAMS = 4
    PUSH = 5
    ACK = 6
    STATUS = 7
    STATUS_REPLY = 8
    ERROR = 9


class ErrorCode(str, enum.Enum):
    """Why a request was refused (sent in ERROR replies, counted by servers)."""

    MALFORMED = "malformed"
    CONFIG_MISMATCH = "config-mismatch"
    UNKNOWN_WORKER = "unknown-worker"
    WRONG_ROUND = "wrong-round"
    STALE_ROUND = "stale-round"
    DUPLICATE = "duplicate"
    WRONG_LENGTH = "wrong-length"
    WRONG_DTYPE = "wrong-dtype"  # a push's values sent as another dtype than the run's
    FINISHED = "finished"
    UNEXPECTED = "unexpected"
    HELLO_FIRST = "hello-first"  # no session: say HELLO, then repeat the request
    FORBIDDEN = "forbidden"  # the authenticated key may not send this
    BUSY = "busy"  # a bounded table of this peer (or of all peers) is full
    TOO_LARGE = "too-large"  # larger than any legal message for this node
    INTERNAL = "internal"  # handling the message raised; the node goes on


class ProtocolError(Exception):
    """A message that does not follow the protocol (answered with ``code``)."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.MALFORMED) -> None:
        super().__init__(message)
        self.code = code


class Refused(Exception):
    """A request that must be answered with an ERROR of ``code`` (and counted)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Hello:
    """A peer introduces itself: role, worker id (-1 if none) and its run configuration."""

    op: ClassVar[Op] = Op.HELLO
    role: str
    worker: int
    config_hash: str
    config: dict[str, Any] = field(default_factory=dict)
    nonce: str = ""  # a worker's session nonce, and its end-to-end tag (common/net/relay_auth.py)
    tag: str = ""


@dataclass(frozen=True)
class Welcome:
    """A server process accepts a HELLO: the shards it hosts (ascending; their ranges
    follow from d and S, ``common.net.sharding``), ``length`` (the values a PUSH to it or a
    PARAMS from it carries: its shards' slices, concatenated in shard order), the
    current round."""

    op: ClassVar[Op] = Op.WELCOME
    shards: list[int]
    num_shards: int
    d: int
    length: int
    round: int
    rounds: int


@dataclass(frozen=True)
class Pull:
    """Ask for the shard's parameters at ``round`` (answered once that round exists).

    ``worker`` is the asking worker's id, -1 for an evaluator.
    """

    op: ClassVar[Op] = Op.PULL
    round: int
    worker: int


@dataclass(frozen=True)
class Params:
    """The parameters of the server's ``shards`` at ``round``, concatenated in shard
    order; ``length`` float32 values follow as raw frames.

    ``bare``: no values follow (the answer to a ``bare_params`` push): round ``round``
    exists, and the worker's process holds its values from another worker's reply."""

    op: ClassVar[Op] = Op.PARAMS
    round: int
    shards: list[int]
    length: int
    bare: bool = False


@dataclass(frozen=True)
class Push:
    """Worker ``worker``'s gradient for ``round`` on the server's shards (their slices
    concatenated in shard order); ``length`` float32 values follow.

    With ``pull_next`` the reply is not an ACK but PARAMS(round + 1), sent once that
    round exists: one exchange per shard and round instead of two. With ``bare_params``
    too, that PARAMS is ``bare``: a process running several workers asks for the values
    once, on one worker's push, since x^{round+1} is the same for all of them (a peer
    that asks for bare replies only deprives itself). ``dtype``: how the values travel,
    float32 or bfloat16 (the run's ``--wire-dtype``; decoded as float32).
    """

    op: ClassVar[Op] = Op.PUSH
    round: int
    worker: int
    length: int
    pull_next: bool = False
    bare_params: bool = False
    dtype: str = FLOAT32
    tag: str = ""  # the worker's end-to-end tag of this header (common/net/relay_auth.py)


@dataclass(frozen=True)
class Ack:
    """A push was accepted."""

    op: ClassVar[Op] = Op.ACK
    round: int
    worker: int


@dataclass(frozen=True)
class Status:
    """Ask a server for its state (monitoring and tests)."""

    op: ClassVar[Op] = Op.STATUS


@dataclass(frozen=True)
class StatusReply:
    """A server's state: its shards, round, progress of the current round, error
    counters."""

    op: ClassVar[Op] = Op.STATUS_REPLY
    shards: list[int]
    round: int
    rounds: int
    finished: bool
    pushes: list[int]
    counters: dict[str, int]


@dataclass(frozen=True)
class Error:
    """A refused request: machine-readable code, human message, the server's current round."""

    op: ClassVar[Op] = Op.ERROR
    code: str
    message: str
    round: int = -1


Header = Hello | Welcome | Pull | Params | Push | Ack | Status | StatusReply | Error
HEADER_TYPES: dict[Op, type[Header]] = {
    t.op: t for t in (Hello, Welcome, Pull, Params, Push, Ack, Status, StatusReply, Error)
}
_TENSOR_OPS = (Op.PARAMS, Op.PUSH)


@dataclass(frozen=True)
class Message:
    """A decoded message: its header and the raw tensor chunks (empty unless PARAMS/PUSH)."""

    header: Header
    chunks: tuple[memoryview, ...] = ()

    def tensor(self) -> np.ndarray:
        """The payload as a float32 array (zero-copy when it arrived as one float32
        frame; bfloat16 values widened into a new one); ``ValueError`` for a bare
        PARAMS, which has none."""
        if not _carries_tensor(self.header):
            raise ValueError(f"a bare {self.header.op.name} carries no values")
        if values_dtype(self.header) == BFLOAT16:
            out = np.empty(_length(self.header), dtype=np.float32)
            self.tensor_into(out)
            return out
        return chunks_to_array(self.chunks, _length(self.header))

    def tensor_into(self, *outs: np.ndarray) -> None:
        """Copy the payload into ``outs``, 1-D float32 arrays filled one after the other
        (one, or each shard's of a message carrying several), exactly its length;
        bfloat16 values are widened on the way."""
        copy_chunks_into(self.chunks, *outs, dtype=values_dtype(self.header))


def encode(header: Header, tensor: np.ndarray | Sequence[np.ndarray] | None = None,
           ) -> list[Buffer]:
    """Frames for ``header`` (and the tensor of a PARAMS/PUSH message: an array, or a
    sequence of arrays sent one after the other without copying, ``length`` in all). A
    bfloat16 PUSH takes its values as bfloat16 bits (uint16, sent as they are) or as
    float32 (rounded here, ``common.net.wire.to_bfloat16``)."""
    frames: list[Buffer] = [_header_frame(header)]
    if _carries_tensor(header):
        if tensor is None:
            raise ValueError(f"{header.op.name} needs a tensor")
        parts = [tensor] if isinstance(tensor, np.ndarray) else list(tensor)
        if sum(int(np.size(p)) for p in parts) != _length(header):
            raise ValueError(f"{header.op.name} announces {_length(header)} values, the "
                             f"tensor holds {sum(int(np.size(p)) for p in parts)}")
        dtype = values_dtype(header)
        for part in parts:
            if dtype == BFLOAT16 and np.asarray(part).dtype != np.uint16:
                part = to_bfloat16(np.asarray(part, dtype=np.float32))
            frames.extend(array_to_chunks(part, int(np.size(part)), NUMPY_DTYPES[dtype]))
    elif tensor is not None:
        raise ValueError(f"{'a bare ' * (header.op in _TENSOR_OPS)}{header.op.name} "
                         "carries no tensor")
    return frames


def reheaded(frames: Sequence[Buffer], header: Header) -> list[Buffer]:
    """``frames`` (``encode``'s, of a PARAMS or PUSH) with ``header`` instead of theirs:
    the payload frames are shared, not encoded again (a push and its re-push differ in
    ``pull_next`` only). ``ValueError`` if ``header`` announces another length."""
    size = sum(memoryview(f).nbytes for f in frames[1:])
    if not _carries_tensor(header) or size != _length(header) * _item_bytes(header):
        raise ValueError(f"{header.op.name} cannot take a payload of {size} bytes")
    return [_header_frame(header), *frames[1:]]


_packers = threading.local()
# Fields added to protocol 3 after its first peers: sent only when not at their default,
# so that such a peer still reads every message that does not need them (a float32 PUSH).
_SENT_IF_SET = {"dtype": FLOAT32, "nonce": "", "tag": ""}


def _header_frame(header: Header) -> bytes:
    body = {"v": PROTOCOL_VERSION, "op": int(header.op)}
    for name, *_ in _SCHEMAS[type(header)]:
        value = getattr(header, name)
        if name in _SENT_IF_SET and value == _SENT_IF_SET[name]:
            continue
        body[name] = value
    # one packer per thread, reused: msgpack.packb makes a new one, whose buffer is 256
    # KiB, for every header (an allocation larger than most messages, per message)
    packer = getattr(_packers, "packer", None)
    if packer is None:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True)
    return cast(bytes, packer.pack(body))  # msgpack has no types: pack returns bytes


def decode(frames: Sequence[Any]) -> Message:
    """Decode frames (bytes, memoryviews or ``zmq.Frame``) into a ``Message``.

    Raises ``ProtocolError`` for anything malformed.
    """
    if not frames:
        raise ProtocolError("empty message")
    raw = _as_buffer(frames[0])
    if len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(raw)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        body = msgpack.unpackb(raw, raw=False, strict_map_key=True, **_UNPACK_LIMITS)
    except Exception as exc:  # msgpack raises many types for garbage
        raise ProtocolError(f"undecodable header: {type(exc).__name__}: {exc}") from None
    if not isinstance(body, dict):
        raise ProtocolError(f"header must be a map, got {type(body).__name__}")
    version = body.pop("v", None)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version!r} not supported (need {PROTOCOL_VERSION})")
    op_code = body.pop("op", None)
    op = _OPS.get(op_code) if _is_int(op_code) else None
    if op is None:
        raise ProtocolError(f"unknown op {op_code!r}")
    header = _build_header(HEADER_TYPES[op], body)
    chunks = tuple(_as_buffer(f) for f in frames[1:])
    if isinstance(header, (Params, Push)):  # op in _TENSOR_OPS
        _check_length(_length(header))
    if values_dtype(header) not in WIRE_DTYPES:
        raise ProtocolError(f"dtype {values_dtype(header)!r} is none of "
                            f"{', '.join(WIRE_DTYPES)}")
    if _carries_tensor(header):
        _check_payload(chunks, _length(header), _item_bytes(header))
    elif chunks:
        raise ProtocolError(f"{'a bare ' * (op in _TENSOR_OPS)}{op.name} carries no tensor "
                            f"but {len(chunks)} extra frames came")
    return Message(header, chunks)


def split_envelope(frames: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """Split ROUTER frames at the first empty delimiter: ``(envelope, message frames)``."""
    for i, f in enumerate(frames):
        if len(_as_buffer(f)) == 0:
            return list(frames[:i]), list(frames[i + 1 :])
    raise ProtocolError("no empty delimiter frame after the routing envelope")


def join_envelope(envelope: Sequence[Any], frames: Sequence[Any]) -> list[Any]:
    """Frames to send back through a ROUTER: the envelope, the delimiter, the message
    (its frames buffers, or ``zmq.Frame`` made once for several sends)."""
    return [*envelope, b"", *frames]


def array_to_chunks(tensor: np.ndarray, length: int,
                    dtype: np.dtype | str = DTYPE) -> list[memoryview]:
    """Zero-copy views of a 1-D array of ``dtype`` (float32 by default), ``CHUNK_BYTES``
    at most each."""
    arr = np.ascontiguousarray(tensor, dtype=dtype)
    if arr.ndim != 1 or arr.size != length:
        raise ValueError(f"tensor must be 1-D with {length} values, got shape {arr.shape}")
    view = arr.data.cast("B")  # memoryview(arr): numpy types its buffer from Python 3.12
    return [view[i : i + CHUNK_BYTES] for i in range(0, max(len(view), 1), CHUNK_BYTES)]


def chunks_to_array(chunks: Sequence[memoryview], length: int) -> np.ndarray:
    """The float32 array held by ``chunks`` (a view when there is a single chunk)."""
    if len(chunks) == 1:
        return np.frombuffer(chunks[0], dtype=DTYPE, count=length)
    out = np.empty(length, dtype=DTYPE)
    copy_chunks_into(chunks, out)
    return out


def copy_chunks_into(chunks: Sequence[memoryview], *outs: np.ndarray,
                     dtype: str = FLOAT32) -> None:
    """Copy the payload chunks into ``outs`` (contiguous float32 arrays filled one after
    the other: a message carrying several shards' slices lands in each shard's row),
    which they must fill exactly; chunks of bfloat16 values (``dtype``) are widened on
    the way. One pass over the chunks, no intermediate array; a chunk that splits a
    value is malformed."""
    item = WIRE_ITEM_BYTES[dtype]
    targets = [o for o in outs if o.size]
    size = sum(len(c) for c in chunks)
    needed = item * sum(t.size for t in targets)
    if size != needed:
        raise ProtocolError(f"payload has {size} bytes, destination needs {needed}")
    which, pos = 0, 0  # the target being filled, and its values filled
    for chunk in chunks:
        if len(chunk) % item:
            raise ProtocolError(f"a tensor chunk of {len(chunk)} bytes splits a value of "
                                f"{item} bytes")
        values = np.frombuffer(chunk, dtype=NUMPY_DTYPES[dtype])
        at = 0
        while at < values.size:
            target = targets[which]
            take = min(values.size - at, target.size - pos)
            if dtype == BFLOAT16:
                from_bfloat16(values[at:at + take], target[pos:pos + take])
            else:
                target[pos:pos + take] = values[at:at + take]
            at += take
            pos += take
            if pos == target.size:
                which, pos = which + 1, 0


def _length(header: Params | Push) -> int:
    return header.length


def values_dtype(header: Header) -> str:
    """How a message's values travel: a PUSH's ``dtype``, float32 for anything else."""
    return getattr(header, "dtype", FLOAT32)


def _item_bytes(header: Header) -> int:
    return WIRE_ITEM_BYTES[values_dtype(header)]


def _carries_tensor(header: Header) -> TypeGuard[Params | Push]:
    """PARAMS (unless bare) and PUSH carry ``length`` values."""
    return header.op in _TENSOR_OPS and not getattr(header, "bare", False)


def _check_length(length: int) -> None:
    """A PUSH or PARAMS (bare too) states 1..MAX_ELEMENTS values."""
    if not 0 < length <= MAX_ELEMENTS:
        raise ProtocolError(f"tensor length {length} outside 1..{MAX_ELEMENTS}")


def _check_payload(chunks: Sequence[memoryview], length: int, item_bytes: int) -> None:
    if any(len(c) > CHUNK_BYTES for c in chunks):
        raise ProtocolError(f"tensor chunk larger than {CHUNK_BYTES} bytes")
    if any(len(c) % item_bytes for c in chunks):
        raise ProtocolError(f"a tensor chunk splits a value of {item_bytes} bytes")
    size = sum(len(c) for c in chunks)
    if size != length * item_bytes:
        name = "float32" if item_bytes == ITEM_BYTES else "bfloat16"
        raise ProtocolError(
            f"payload has {size} bytes but the header announces {length} {name} "
            f"({length * item_bytes} bytes)"
        )


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "str": (str,),
    "bool": (bool,),
    "dict[str, Any]": (dict,),
    "dict[str, int]": (dict,),
    "list[int]": (list,),
}

# Per header type: (field name, annotation, allowed types, required), computed once.
_SCHEMAS: dict[type[Header], tuple[tuple[str, str, tuple[type, ...], bool], ...]] = {
    cls: tuple(
        (f.name, str(f.type), _FIELD_TYPES[str(f.type)],
         f.default is MISSING and f.default_factory is MISSING)
        for f in fields(cls)
    )
    for cls in HEADER_TYPES.values()
}


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# Per header type: the names of its fields.
_FIELD_NAMES: dict[type[Header], frozenset[str]] = {
    cls: frozenset(name for name, *_ in schema) for cls, schema in _SCHEMAS.items()
}
_OPS: dict[int, Op] = {int(op): op for op in Op}


def _build_header(cls: type[Header], body: dict[str, Any]) -> Header:
    schema = _SCHEMAS[cls]
    names = _FIELD_NAMES[cls]
    if not body.keys() <= names:
        unknown = sorted(map(str, set(body) - names))
        raise ProtocolError(f"{cls.__name__}: unknown fields {unknown}")
    for name, annotation, allowed, required in schema:
        if name not in body:
            if required:
                raise ProtocolError(f"{cls.__name__}: missing field {name!r}")
            continue
        value = body[name]
        # bool is a subclass of int: refuse it where an int is expected
        if not isinstance(value, allowed) or (bool not in allowed and isinstance(value, bool)):
            raise ProtocolError(
                f"{cls.__name__}.{name} must be {annotation}, got {type(value).__name__}"
            )
        # (isinstance against a tuple of types leaves mypy with an object: these casts
        # restate what `allowed` has just checked)
        if annotation == "list[int]" and not all(_is_int(x) for x in cast("list[Any]", value)):
            raise ProtocolError(f"{cls.__name__}.{name} must hold integers")
        if annotation == "dict[str, int]" and not all(
            isinstance(k, str) and _is_int(x) for k, x in cast("dict[Any, Any]", value).items()
        ):
            raise ProtocolError(f"{cls.__name__}.{name} must map strings to integers")
    return cls(**body)


def _as_buffer(frame: Any) -> memoryview:
    """A memoryview of a frame given as bytes, buffer or ``zmq.Frame``."""
    buf = getattr(frame, "buffer", frame)
    try:
        view = memoryview(buf)
    except TypeError:
        raise ProtocolError(f"frame of type {type(frame).__name__} is not a buffer") from None
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view
