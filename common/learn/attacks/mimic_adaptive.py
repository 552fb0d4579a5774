"""Adaptive mimic (Karimireddy, He, Jaggi, "Byzantine-Robust Learning on Heterogeneous
Datasets via Bucketing", ICLR 2022): every Byzantine worker copies the honest worker that
lies furthest along the direction in which the honest vectors vary most, a direction it
learns over a warm-up with a power iteration (classic model; the paper's experiments'
mimic attack, ``MimicVariantAttacker`` in their code, epfml/byzantine-robust-noniid-
optimizer, ``codes/attacks/mimic.py``). ``mimic`` is the simple variant: a fixed worker.

What their code does, round t counted from the attacker's first round (one of their
iterations is one of our rounds: one minibatch gradient per worker, one aggregation):

* t = 0: mu = the mean of the honest vectors g_i; z_0 ~ N(0, I) (their generator seeded
  with 0 whatever the run's seed); z = one power step: sum_i ((g_i - mu) . z_0)(g_i - mu),
  normalised.
* 0 < t < warm-up: mu becomes the mean of the rounds' means so far,
  mu = (t mu + mean_t) / (t + 1); the power step s from z about the new mu, normalised,
  is averaged in: z = (t z + s / |s|) / (t + 1), then normalised.
* t < warm-up: the target is chosen again every round, the honest worker with the largest
  g_i . z (``argmax=True``, their default and the only value their experiments use; the
  smallest with ``argmax=False``), and its vector of this round is sent.
* t >= warm-up: the target is fixed, the last one chosen; mu and z are no longer updated;
  the attacker sends the target's vector of each round.

Their warm-up is ``--mimic-warmup``, in iterations, default 1 (no script or README of
their repository sets another): z is then the single power step of round 0 and the target is fixed
from round 0 on. A warm-up meant as E epochs is E times the rounds of an epoch here
(their experiments: 30 batches an epoch, so 30 rounds each).

Here, the same, with these definitions: z_0 is drawn from the round's attack stream
(``rng``: the run's seed, so every Byzantine worker draws the same one); mu and z are
float64; a power step of length 0 (all honest vectors equal along z, e.g. one honest
worker) leaves z as it was (z_0 normalised on the first round) where their code divides by
0 and, z then NaN, picks the first worker; ties go to the lowest id, as theirs. A round
whose honest vectors are not all finite teaches nothing: mu, z and the target stay as they
were (the target starts as the first honest worker), the round still counts towards the
warm-up, and its copy is the target's vector, non-finite or not. The state lives in a
:class:`MimicMemory`, one per Byzantine worker (``worker/byzantine.py``), process state:
a restarted worker warms up again from its first round back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from common.conf.settings import WORKER, setting
from common.learn.attacks.base import VectorAttack, check_honest, register_attack, repeat

WARMUP = 1  # their --mimic-warmup default, in iterations (= rounds)
PICKS = ("max", "min")  # their argmax=True / False


@dataclass
class MimicMemory:
    """What the attacker carries from round to round: the rounds it has forged, the number
    learned from (finite rounds of the warm-up), the running mean ``mean`` of the honest
    means and the unit direction ``direction`` (float64, None before the first learned
    round), and the target, an index into the honest rows (ordered by worker id)."""

    rounds: int = 0
    learned: int = 0
    mean: np.ndarray | None = None
    direction: np.ndarray | None = None
    target: int = 0


def _norm(v: np.ndarray) -> float:
    # numpy's pairwise sum, not BLAS: the same bits whatever the thread count
    return math.sqrt(float(np.sum(v * v)))


def projections(rows: np.ndarray, z: np.ndarray) -> np.ndarray:
    """``rows[i] . z`` for each row, in float64 (a pairwise sum a row, not BLAS)."""
    return np.array([np.sum(row * z) for row in rows], dtype=np.float64)


def power_step(centered: np.ndarray, z: np.ndarray) -> np.ndarray:
    """One power-iteration step of the scatter matrix C = sum_i c_i c_i^T of the rows
    ``centered`` (c_i) on ``z``: C z = sum_i (c_i . z) c_i, accumulated in row order."""
    out = np.zeros(centered.shape[1], dtype=np.float64)
    for row, weight in zip(centered, projections(centered, z), strict=True):
        out += weight * row
    return out


def _unit(v: np.ndarray) -> np.ndarray | None:
    """``v / |v|``, or None for a zero vector."""
    length = _norm(v)
    return v / length if length > 0 else None


def learn(memory: MimicMemory, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Update ``memory``'s mean and direction from a round's honest rows, float64 and
    finite (their ``_init_callback`` on the first learned round, ``_warmup_callback``
    after); returns the direction."""
    avg = rows.mean(axis=0)
    k = memory.learned
    if memory.mean is None or memory.direction is None:
        start = np.asarray(rng.standard_normal(rows.shape[1]), dtype=np.float64)
        step = _unit(power_step(rows - avg, start))
        z = step if step is not None else start / _norm(start)
    else:
        avg = (k / (k + 1)) * memory.mean + avg / (k + 1)
        z = memory.direction
        step = _unit(power_step(rows - avg, z))
        if step is not None:  # (step . z >= 0: their mix never cancels)
            z = (k / (k + 1)) * z + step / (k + 1)
            z = z / _norm(z)
    memory.mean, memory.direction, memory.learned = avg, z, k + 1
    return z


def choose(rows: np.ndarray, direction: np.ndarray, pick: str = "max") -> int:
    """The index of the row with the largest (``pick="max"``) or smallest (``"min"``)
    projection ``g_i . direction``; the first of ties."""
    values = projections(rows, direction)
    return int(np.argmax(values) if pick == "max" else np.argmin(values))


def mimic_adaptive(honest: np.ndarray, num_byzantine: int, rng: np.random.Generator,
                   memory: MimicMemory, warmup: int = WARMUP, pick: str = "max") -> np.ndarray:
    """``num_byzantine`` copies of the target's row of ``honest``; during the first
    ``warmup`` rounds of ``memory`` the direction is learned and the target chosen again
    each round, then the target stays fixed (module docstring). ``rng``: the round's
    attack stream, read once, for the random start of the power iteration. Updates
    ``memory``; ``ValueError`` if the honest rows' shape changed since its first round."""
    check_honest(honest, num_byzantine)
    if warmup < 1:
        raise ValueError(f"mimic-adaptive warm-up must be >= 1 round, got {warmup}")
    if pick not in PICKS:
        raise ValueError(f"mimic-adaptive pick must be one of {', '.join(PICKS)}, got {pick!r}")
    h, d = honest.shape
    if memory.target >= h or (memory.mean is not None and memory.mean.shape[0] != d):
        raise ValueError(f"mimic-adaptive memory holds target {memory.target} of vectors of "
                         f"{'?' if memory.mean is None else memory.mean.shape[0]} values, got "
                         f"{h} honest rows of {d}")
    if memory.rounds < warmup:
        rows = honest.astype(np.float64)
        if np.isfinite(rows).all():  # (a non-finite round teaches nothing)
            memory.target = choose(rows, learn(memory, rows, rng), pick)
    memory.rounds += 1
    return repeat(honest[memory.target], num_byzantine)


@register_attack
@dataclass(frozen=True)
class MimicAdaptive(VectorAttack):
    """Copies of the honest worker furthest along the honest vectors' top principal
    direction, learned over a warm-up, then fixed. Byzantine workers only: the direction is
    of whole vectors, and the memory is the worker's (a proxy sees one shard)."""

    name: ClassVar[str] = "mimic-adaptive"
    summary: ClassVar[str] = ("copies of the correct worker furthest along the correct "
                              "vectors' top principal direction, learned by a power iteration "
                              "over `--mimic-adaptive-warmup` rounds, then fixed (ICLR 2022)")
    sites: ClassVar[frozenset[str]] = frozenset({WORKER})
    stateful: ClassVar[bool] = True
    function = staticmethod(mimic_adaptive)

    warmup: int = setting(WARMUP, "Adaptive mimic attack: rounds of the warm-up, in which "
                          "the direction of largest variance is learned and the copied worker "
                          "chosen again each round; fixed after (the authors' code: "
                          "--mimic-warmup, in iterations, one a round; default 1).",
                          flag="--mimic-adaptive-warmup", minimum=1)
    pick: str = setting("max", "Adaptive mimic attack: copy the correct worker with the "
                        "largest (max, the authors' argmax=True) or smallest (min) projection "
                        "on the direction.", flag="--mimic-adaptive-pick", choices=PICKS)

    def start_memory(self) -> MimicMemory:
        return MimicMemory()

    def forge(self, honest: np.ndarray, num_byzantine: int, rng: np.random.Generator,
              num_workers: int, memory: MimicMemory | None = None) -> np.ndarray:
        """:func:`mimic_adaptive` with ``memory``, the worker's state from round to round."""
        if memory is None:
            raise ValueError(f"{self.name} carries state from round to round: it needs "
                             "its memory")
        return mimic_adaptive(honest, num_byzantine, rng, memory, **self.parameters())
