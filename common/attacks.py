"""Byzantine corruptions as pure functions with an explicit random generator.

Two models of Xie, Koyejo, Gupta, *Generalized Byzantine-tolerant SGD* (ICML 2018):

* **Value-level** (generalized Byzantine model, Sec. 2): single values of the n x d
  gradient matrix are arbitrary. The proxy applies these to ONE push, i.e. one worker's
  1-D float32 gradient shard: :func:`gambler` and :func:`bitflip` (built on
  :func:`bitflip_victims` and :func:`flip_bits`). Each returns ``(new_values, count)``.
* **Vector-level** (classic Byzantine model): whole vectors of Byzantine workers are
  replaced. Each function takes the honest gradients ``honest`` of shape (h, d), float32,
  and returns the ``(num_byzantine, d)`` float32 vectors the Byzantine workers send:
  :func:`gaussian`, :func:`omniscient` (paper, Sec. 6), :func:`signflip`, :func:`alie`
  (Baruch et al., 2019) and :func:`ipm` (Xie et al., 2019).

No function modifies its inputs. All randomness comes from the ``rng`` argument, and each
function draws a fixed amount from it, so a stream derived with
:func:`common.seeding.derive_rng` gives the same corruption in every process.
Select attacks by name through :data:`VALUE_ATTACKS` / :data:`VECTOR_ATTACKS`
(or :func:`value_attack` / :func:`vector_attack`, which give a clear error).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from statistics import NormalDist

import numpy as np

_FLOAT32_MAX = float(np.finfo(np.float32).max)

BITFLIP_PAPER_BITS: tuple[int, ...] = (21, 29, 30, 31)
"""0-based bits of the paper's text ("the 22th, 30th, 31th and 32th bits", 1-based)."""
BITFLIP_PAPER_COORDS = 1000
"""The paper corrupts one of the n values of each of the first 1000 coordinates."""
BITFLIP_CODE_BITS: tuple[int, ...] = (22, 29, 30, 31)
"""0-based bits flipped by the authors' later public code."""
BITFLIP_CODE_COORDS = 500
"""Coordinates corrupted by the authors' later public code."""


# --------------------------------------------------------------------------- validation


def _check_values(values: np.ndarray) -> None:
    if not isinstance(values, np.ndarray) or values.ndim != 1 or values.dtype != np.float32:
        raise ValueError(
            "values must be a 1-D float32 numpy array, got "
            f"{type(values).__name__} {getattr(values, 'dtype', '?')} "
            f"of shape {getattr(values, 'shape', '?')}"
        )


def _check_honest(honest: np.ndarray, num_byzantine: int) -> None:
    if not isinstance(honest, np.ndarray) or honest.ndim != 2 or honest.dtype != np.float32:
        raise ValueError(
            "honest must be a 2-D (h, d) float32 numpy array, got "
            f"{type(honest).__name__} {getattr(honest, 'dtype', '?')} "
            f"of shape {getattr(honest, 'shape', '?')}"
        )
    if honest.shape[0] < 1:
        raise ValueError("honest must hold at least one gradient row, got h=0")
    if isinstance(num_byzantine, bool) or not isinstance(num_byzantine, (int, np.integer)):
        raise ValueError(f"num_byzantine must be an int, got {num_byzantine!r}")
    if num_byzantine < 1:
        raise ValueError(f"num_byzantine must be >= 1, got {num_byzantine}")


def _check_float32_scale(name: str, scale: float) -> np.float32:
    if not math.isfinite(scale) or abs(scale) > _FLOAT32_MAX:
        raise ValueError(f"{name} must be finite and representable in float32, got {scale!r}")
    return np.float32(scale)


def _row_sum(honest: np.ndarray) -> np.ndarray:
    """Float32 sum of the rows, added one row at a time in order (reproducible anywhere)."""
    acc = honest[0].copy()
    with np.errstate(over="ignore", invalid="ignore"):
        for row in honest[1:]:
            acc += row
    return acc


def _row_mean(honest: np.ndarray) -> np.ndarray:
    """Float32 coordinate-wise mean: :func:`_row_sum` divided by the row count."""
    return _row_sum(honest) / np.float32(honest.shape[0])


def _repeat(vector: np.ndarray, num_byzantine: int) -> np.ndarray:
    return np.tile(vector.astype(np.float32, copy=False), (num_byzantine, 1))


# --------------------------------------------------------------------------- value level


def gambler(
    values: np.ndarray, rng: np.random.Generator, p: float = 5e-4, scale: float = -1e20
) -> tuple[np.ndarray, int]:
    """Multiply each value by ``scale`` independently with probability ``p`` (paper, Sec. 6).

    The paper's gambler owns one of 20 parameter servers and multiplies any value it
    receives by -1e20 with probability 0.05 %. The mask is ``rng.random(values.size) < p``,
    so exactly ``values.size`` uniforms are drawn whatever ``p``. The product is computed in
    float32: for ``|v| > ~3.4e18`` ``v * -1e20`` overflows to -inf/+inf (no warning is
    raised), which is still a Byzantine value. Returns ``(new_values, number_corrupted)``.
    """
    _check_values(values)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"gambler probability p must be in [0, 1], got {p!r}")
    factor = _check_float32_scale("gambler scale", scale)
    mask = rng.random(values.size) < p
    out = values.copy()
    with np.errstate(over="ignore", invalid="ignore"):
        out[mask] = values[mask] * factor
    return out, int(np.count_nonzero(mask))


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
    _check_values(values)
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
    _check_values(values)
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


# --------------------------------------------------------------------------- vector level


def gaussian(
    honest: np.ndarray, num_byzantine: int, rng: np.random.Generator, sd: float = 200.0
) -> np.ndarray:
    """I.i.d. N(0, sd^2) vectors (paper, Sec. 6: 6 of 20 vectors with sd 200).

    Drawn as ``rng.standard_normal((num_byzantine, d), dtype=float32) * float32(sd)``.
    """
    _check_honest(honest, num_byzantine)
    if not (math.isfinite(sd) and sd >= 0):
        raise ValueError(f"gaussian sd must be finite and >= 0, got {sd!r}")
    noise = rng.standard_normal((num_byzantine, honest.shape[1]), dtype=np.float32)
    return noise * np.float32(sd)


def omniscient(
    honest: np.ndarray, num_byzantine: int, rng: np.random.Generator, scale: float = 1e20
) -> np.ndarray:
    """Each Byzantine vector is ``-scale * sum(honest)`` (paper, Sec. 6, scale 1e20).

    The sum is taken in float32, adding the rows in order (as ``np.sum(axis=0)`` does on a
    C-contiguous array); the product is float32 too, so coordinates whose ``|scale * sum|``
    exceeds ~3.4e38 become -inf/+inf. ``rng`` is not used.
    """
    _check_honest(honest, num_byzantine)
    factor = _check_float32_scale("omniscient scale", scale)
    with np.errstate(over="ignore", invalid="ignore"):
        vector = _row_sum(honest) * -factor
    return _repeat(vector, num_byzantine)


def signflip(
    honest: np.ndarray, num_byzantine: int, rng: np.random.Generator, scale: float = 1.0
) -> np.ndarray:
    """Each Byzantine vector is ``-scale * mean(honest)``: the negated honest gradient.

    Reading used here: a sign-flipping worker sends the negative of the gradient it would
    have sent honestly, modelled by the mean of the honest rows. ``rng`` is not used.
    """
    _check_honest(honest, num_byzantine)
    factor = _check_float32_scale("signflip scale", scale)
    with np.errstate(over="ignore", invalid="ignore"):
        vector = _row_mean(honest) * -factor
    return _repeat(vector, num_byzantine)


def alie_z(n: int, num_byzantine: int) -> float:
    """ALIE's default z (Baruch et al., 2019): ``s = floor(n/2 + 1) - f``,
    ``z = Phi^{-1}((n - s) / n)``."""
    s = math.floor(n / 2 + 1) - num_byzantine
    if n < 1 or s < 1:
        raise ValueError(
            f"ALIE's z is undefined for n={n}, f={num_byzantine}: needs n >= 1 and "
            f"s = floor(n/2 + 1) - f >= 1 (got s={s}); pass z explicitly"
        )
    return NormalDist().inv_cdf((n - s) / n)


def alie(
    honest: np.ndarray,
    num_byzantine: int,
    rng: np.random.Generator,
    z: float | None = None,
    n: int | None = None,
) -> np.ndarray:
    """A Little Is Enough (Baruch et al., 2019): ``mean - z * std``, coordinate-wise.

    Mean and standard deviation are over the honest rows, computed in float64 and cast to
    float32; the std is the population one (``ddof=0``, defined for a single row too).
    ``z`` defaults to :func:`alie_z` with ``n`` workers in all (default: honest rows +
    ``num_byzantine``) and ``f = num_byzantine``. ``rng`` is not used.
    """
    _check_honest(honest, num_byzantine)
    if z is None:
        z = alie_z(honest.shape[0] + num_byzantine if n is None else n, num_byzantine)
    elif not math.isfinite(z):
        raise ValueError(f"ALIE z must be finite, got {z!r}")
    mean = honest.mean(axis=0, dtype=np.float64)
    std = honest.std(axis=0, dtype=np.float64)
    return _repeat(mean - z * std, num_byzantine)


def ipm(
    honest: np.ndarray, num_byzantine: int, rng: np.random.Generator, epsilon: float = 0.1
) -> np.ndarray:
    """Inner-Product Manipulation (Xie, Koyejo, Gupta, 2019): ``-epsilon * mean(honest)``.

    A small epsilon keeps the Byzantine vectors close to the honest ones while making the
    inner product of the aggregate with the true gradient negative. ``rng`` is not used.
    """
    _check_honest(honest, num_byzantine)
    factor = _check_float32_scale("ipm epsilon", epsilon)
    return _repeat(_row_mean(honest) * -factor, num_byzantine)


# --------------------------------------------------------------------------- registries

ValueAttack = Callable[..., tuple[np.ndarray, int]]
VectorAttack = Callable[..., np.ndarray]

VALUE_ATTACKS: dict[str, ValueAttack] = {"gambler": gambler, "bitflip": bitflip}
"""Value-level attacks: ``f(values, rng, **params) -> (new_values, count)``."""

VECTOR_ATTACKS: dict[str, VectorAttack] = {
    "gaussian": gaussian,
    "omniscient": omniscient,
    "signflip": signflip,
    "alie": alie,
    "ipm": ipm,
}
"""Vector-level attacks: ``f(honest, num_byzantine, rng, **params) -> (num_byzantine, d)``."""


def value_attack_names() -> tuple[str, ...]:
    """Names of the value-level attacks, in registry order."""
    return tuple(VALUE_ATTACKS)


def vector_attack_names() -> tuple[str, ...]:
    """Names of the vector-level attacks, in registry order."""
    return tuple(VECTOR_ATTACKS)


def value_attack(name: str) -> ValueAttack:
    """The value-level attack called ``name``; ValueError listing the valid names."""
    try:
        return VALUE_ATTACKS[name]
    except KeyError:
        raise ValueError(
            f"unknown value attack {name!r}; valid: {', '.join(VALUE_ATTACKS)}"
        ) from None


def vector_attack(name: str) -> VectorAttack:
    """The vector-level attack called ``name``; ValueError listing the valid names."""
    try:
        return VECTOR_ATTACKS[name]
    except KeyError:
        raise ValueError(
            f"unknown vector attack {name!r}; valid: {', '.join(VECTOR_ATTACKS)}"
        ) from None
