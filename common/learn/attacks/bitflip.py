"""Bit-flip (paper, Sec. 6): chosen bits of one value in each of the first k coordinates
of the gradient are flipped (generalized Byzantine model)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from common.conf.settings import setting
from common.errors import ConfigError
from common.learn.attacks.base import Site, ValueAttack, check_values, register_attack
from common.learn.seeding import derive_rng

BITFLIP_PAPER_BITS: tuple[int, ...] = (21, 29, 30, 31)
"""0-based bits of the paper's text ("the 22th, 30th, 31th and 32th bits", 1-based)."""
BITFLIP_PAPER_COORDS = 1000
"""The paper corrupts one of the n values of each of the first 1000 coordinates."""
BITFLIP_CODE_BITS: tuple[int, ...] = (22, 29, 30, 31)
"""0-based bits flipped by the authors' later public code."""
BITFLIP_CODE_COORDS = 500
"""Coordinates corrupted by the authors' later public code."""


def bitflip_victims(n: int, num_coords: int, rng: np.random.Generator) -> np.ndarray:
    """For each of ``num_coords`` coordinates, the one worker of ``n`` whose value is hit.

    Uniform over ``0..n-1``, int64, drawn as ``rng.integers(0, n, num_coords)``.
    """
    if n < 1:
        raise ValueError(f"bitflip needs n >= 1 workers, got n={n}")
    if num_coords < 0:
        raise ValueError(f"num_coords must be >= 0, got {num_coords}")
    return rng.integers(0, n, size=num_coords, dtype=np.int64)


def _bit_mask(bits: Sequence[int]) -> np.uint32:
    bits = list(bits)
    if not bits:
        raise ValueError("bits must name at least one bit")
    bad = [
        b
        for b in bits
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 0 <= b <= 31
    ]
    if bad:
        raise ValueError(f"bits must be ints in 0..31 (0 = least significant), got {bad}")
    if len(set(bits)) != len(bits):
        raise ValueError(f"bits must be distinct, got {bits}")
    return np.uint32(sum(1 << int(b) for b in bits))


def flip_bits(
    values: np.ndarray, coords: np.ndarray, bits: Sequence[int] = BITFLIP_PAPER_BITS
) -> tuple[np.ndarray, int]:
    """A copy of ``values`` with the 0-based ``bits`` of float32 ``values[coords]`` flipped.

    Bits are numbered from the least significant (0) to the sign (31); the default is the
    paper's text, 0-based (21, 29, 30, 31): one mantissa bit, two exponent bits, the sign.
    ``coords`` must be distinct indices into ``values``. Returns
    ``(new_values, len(coords))``: every targeted value changes bit pattern.
    """
    check_values(values)
    mask = _bit_mask(bits)
    coords = np.asarray(coords)
    if coords.ndim != 1 or (coords.size and not np.issubdtype(coords.dtype, np.integer)):
        raise ValueError(f"coords must be a 1-D integer array, got {coords.dtype} {coords.shape}")
    coords = coords.astype(np.int64, copy=False)
    if coords.size:
        if coords.min() < 0 or coords.max() >= values.size:
            raise ValueError(
                f"coords must lie in [0, {values.size}), got range [{coords.min()}, {coords.max()}]"
            )
        if np.unique(coords).size != coords.size:
            raise ValueError("coords must be distinct (a repeated flip would undo itself)")
    out = values.copy()
    as_bits = out.view(np.uint32)
    as_bits[coords] ^= mask
    return out, int(coords.size)


def bitflip(
    values: np.ndarray,
    rng: np.random.Generator,
    *,
    worker: int,
    n: int,
    offset: int = 0,
    num_coords: int = BITFLIP_PAPER_COORDS,
    bits: Sequence[int] = BITFLIP_PAPER_BITS,
) -> tuple[np.ndarray, int]:
    """Bit-flip attack on one push: worker ``worker``'s values at global ``offset...``.

    Paper, Sec. 6: for each of the first ``num_coords`` coordinates of the gradient, one of
    the ``n`` values is corrupted by flipping ``bits`` of its float32. The paper's text says
    the first 1000 coordinates, bits 22, 30, 31, 32 (1-based) = :data:`BITFLIP_PAPER_BITS`
    (the default); the authors' later code flips 0-based bits 22, 29, 30, 31 of the first
    500 coordinates (:data:`BITFLIP_CODE_BITS`, :data:`BITFLIP_CODE_COORDS`).

    The victims come from :func:`bitflip_victims` with ``rng``, so ``rng`` must be in the
    same state for every worker's push of a round (derive it from (seed, round), not from
    the worker): then each coordinate is hit in exactly one worker. ``values`` is the shard
    holding global coordinates ``offset .. offset + len(values) - 1``.
    """
    check_values(values)
    if n < 1:
        raise ValueError(f"bitflip needs n >= 1 workers, got n={n}")
    if not 0 <= worker < n:
        raise ValueError(f"worker must be in [0, {n}), got {worker}")
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    victims = bitflip_victims(n, num_coords, rng)
    hit = np.flatnonzero(victims == worker)
    local = hit[(hit >= offset) & (hit < offset + values.size)] - offset
    return flip_bits(values, local, bits)


def _text(bits: tuple[int, ...]) -> str:
    return ",".join(map(str, bits))


@register_attack
@dataclass(frozen=True)
class BitFlip(ValueAttack):
    """For each of the first ``coords`` model coordinates, one of the n workers (drawn per
    round) has ``bits`` of its value flipped; a proxy flips those in its shard."""

    name: ClassVar[str] = "bitflip"
    summary: ClassVar[str] = ("bits `--bitflip-bits` of one value in each of the first "
                              "`--bitflip-coords` coordinates")

    bits: tuple[int, ...] = setting(
        BITFLIP_PAPER_BITS, "Bit-flip: 0-based float32 bits flipped (paper text "
        f"{_text(BITFLIP_PAPER_BITS)}; the authors' code {_text(BITFLIP_CODE_BITS)}).",
        flag="--bitflip-bits", minimum=0, maximum=31)
    coords: int = setting(
        BITFLIP_PAPER_COORDS, "Bit-flip: the first k model coordinates each get one corrupted "
        f"value (paper {BITFLIP_PAPER_COORDS}; the authors' code {BITFLIP_CODE_COORDS}).",
        flag="--bitflip-coords", minimum=0)

    def check(self, num_workers: int, num_byzantine: int) -> None:
        super().check(num_workers, num_byzantine)
        try:
            _bit_mask(self.bits)
        except ValueError as exc:
            raise ConfigError(f"--bitflip-bits: {exc}") from None

    def corrupt(self, values: np.ndarray, site: Site) -> tuple[np.ndarray, int]:
        rng = derive_rng(site.seed, f"proxy-bitflip-{site.what}", site.round)
        return bitflip(values, rng, worker=site.worker, n=site.num_workers, offset=site.start,
                       num_coords=self.coords, bits=self.bits)
