"""Derivation of independent, reproducible random streams.

Every random stream of the system (data sampling, dropout, attacks) is derived
from the run seed plus a role name and integer coordinates such as
(round, worker, shard), so that a result never depends on process layout or
message arrival order. The multi-process cluster and the in-process reference
engine (``ps/reference/engine.py``) therefore draw exactly the same numbers.
"""

from __future__ import annotations

import zlib

import numpy as np


def role_code(role: str) -> int:
    """A stable 32-bit code for a role name (CRC-32, identical on every platform)."""
    return zlib.crc32(role.encode("utf-8"))


def derive_seed_sequence(seed: int, role: str, *coords: int) -> np.random.SeedSequence:
    """The seed sequence of stream ``role`` at ``coords`` (all non-negative ints)."""
    if seed < 0 or any(c < 0 for c in coords):
        raise ValueError(f"seed and coordinates must be non-negative, got {seed}, {coords}")
    return np.random.SeedSequence([int(seed), role_code(role), *[int(c) for c in coords]])


def derive_rng(seed: int, role: str, *coords: int) -> np.random.Generator:
    """A numpy Generator for stream ``role`` at ``coords``: same inputs, same numbers."""
    return np.random.Generator(np.random.PCG64(derive_seed_sequence(seed, role, *coords)))


def derive_int_seed(seed: int, role: str, *coords: int) -> int:
    """A 63-bit integer seed (for ``torch.Generator.manual_seed``) for ``role`` at ``coords``."""
    return int(derive_seed_sequence(seed, role, *coords).generate_state(1, np.uint64)[0] >> 1)
