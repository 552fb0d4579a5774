"""What a worker's pushed values are on the wire: float32, or bfloat16 (``--wire-dtype``).

bfloat16 keeps float32's sign and 8-bit exponent and the top 7 bits of its mantissa: half
the bytes of every push (and of the worker's replay window), with float32's range, so
the gambler's -1e20 (rounded to -9.97e19) and the infinities keep their magnitude. A
worker rounds its vector once, to nearest with ties to even (torch's conversion; a NaN
stays a NaN, its payload is not kept), and
the servers widen it back exactly (the 16 low bits zero); the reference engine rounds at
the same point (:func:`round_to_wire`), so ``--verify`` stays bit-identical. A proxy
corrupts the decoded values, as float32, then rounds what it forwards the same way.
PARAMS replies stay float32: the parameters are not rounded.
"""

from __future__ import annotations

from typing import Any

import numpy as np

FLOAT32, BFLOAT16 = "float32", "bfloat16"
WIRE_DTYPES = (FLOAT32, BFLOAT16)
ITEM_BYTES = {FLOAT32: 4, BFLOAT16: 2}
# as numpy holds them
NUMPY_DTYPES: dict[str, np.dtype[Any]] = {FLOAT32: np.dtype("<f4"), BFLOAT16: np.dtype("<u2")}


def to_bfloat16(values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The bfloat16 bits (uint16) of float32 ``values``, rounded to nearest, ties to even,
    written into ``out`` (a uint16 array of the same length) or a new array."""
    import torch

    if out is None:
        out = np.empty(values.shape, dtype=np.uint16)
    source = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
    torch.from_numpy(out.view(np.int16)).view(torch.bfloat16).copy_(source)
    return out


def from_bfloat16(bits: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Widen bfloat16 ``bits`` (uint16 values: a received frame's, read-only, or an
    array's) into float32 ``out``, exactly: each value's bits become the high half of
    its float32."""
    wide = out.view(np.uint32)
    wide[:] = bits  # (faster than one left_shift of the uint16 values into uint32)
    wide <<= 16
    return out


def to_wire(values: np.ndarray, dtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """What a worker sends of float32 ``values`` as ``dtype``: themselves for float32,
    else their bfloat16 bits (into ``out``, a uint16 vector, or a new one)."""
    return values if dtype == FLOAT32 else to_bfloat16(values, out)


def round_to_wire(values: np.ndarray, dtype: str, out: np.ndarray | None = None,
                  bits: np.ndarray | None = None) -> np.ndarray:
    """``values`` as the servers receive them when pushed as ``dtype``: themselves for
    float32, else rounded to bfloat16 (into ``bits``, a uint16 vector, or a new one) and
    widened (into ``out``, a float32 vector, or a new one)."""
    if dtype == FLOAT32:
        return values
    if out is None:
        out = np.empty(values.shape, dtype=np.float32)
    return from_bfloat16(to_bfloat16(values, bits), out)
