"""What every attack shares: the two models, the class contract, checks, the registry.

Two models of Xie, Koyejo, Gupta, *Generalized Byzantine-tolerant SGD* (ICML 2018):

* **Value-level** (generalized Byzantine model, Sec. 2): single values of the n x d
  gradient matrix are arbitrary. A :class:`ValueAttack` corrupts ONE push (one worker's
  1-D float32 gradient shard) in flight, at a proxy.
* **Vector-level** (classic Byzantine model): whole vectors of Byzantine workers are
  replaced. A :class:`VectorAttack` forges the ``(num_byzantine, d)`` vectors from the
  honest gradients ``honest`` of shape (h, d); Byzantine workers send them, or a proxy
  puts them in place of its victims' pushes.

An attack is a frozen dataclass whose fields are its parameters, each declared as a
setting (``common.conf.settings``): flag, ``PS_*`` variable and help come from there, and the
roles that take them from where the attack can run (:attr:`Attack.sites`). Each module
of this package holds one attack, with the pure function that does the math, and
registers it with :func:`register_attack` (``common.conf.registry``): adding an attack is
adding a file and naming it in the package's ``CATALOGUE``.

No attack modifies its inputs. All randomness comes from an explicit generator derived
with :func:`common.learn.seeding.derive_rng` from (seed, attack, round, worker, shard), so a
cluster and the reference engine draw the same numbers.

Two kinds of vector attack need more than the honest vectors:

* ``reads_rule``: the attack searches its factor against the aggregation the run's
  servers actually compute (optimised ALIE and IPM). It is handed an :class:`Aim`, built
  by ``worker/byzantine.py`` from the run configuration (the rule, q and the
  pre-aggregation chain of every shard), and uses :func:`line_maximize`.
* ``trains``: the Byzantine worker computes its vector itself with the trainer on its own
  partition, with the labels mapped by :meth:`VectorAttack.relabel` (label flipping); it
  forges nothing from the honest vectors.
* ``stateful``: the attack carries a memory from round to round (the adaptive mimic's
  learned direction and target), made by :meth:`VectorAttack.start_memory` and updated by
  each ``forge(..., memory=)``; every Byzantine worker keeps its own
  (``worker/byzantine.py``), as process state.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import numpy as np

from common.conf.registry import Registry
from common.conf.settings import CLUSTER, PROXY, SIMULATE, WORKER, check_ranges, declared
from common.errors import ConfigError
from common.learn.seeding import derive_rng

FLOAT32_MAX = float(np.finfo(np.float32).max)
NO_ATTACK = "none"


# --------------------------------------------------------------------------- input checks


def check_values(values: np.ndarray) -> None:
    """``ValueError`` unless ``values`` is a 1-D float32 array."""
    if not isinstance(values, np.ndarray) or values.ndim != 1 or values.dtype != np.float32:
        raise ValueError(
            "values must be a 1-D float32 numpy array, got "
            f"{type(values).__name__} {getattr(values, 'dtype', '?')} "
            f"of shape {getattr(values, 'shape', '?')}"
        )


def check_honest(honest: np.ndarray, num_byzantine: int) -> None:
    """``ValueError`` unless ``honest`` is (h >= 1, d) float32 and ``num_byzantine >= 1``."""
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


def float32_scale(name: str, scale: float) -> np.float32:
    """``scale`` as float32; ``ValueError`` if it is not finite or not representable."""
    if not math.isfinite(scale) or abs(scale) > FLOAT32_MAX:
        raise ValueError(f"{name} must be finite and representable in float32, got {scale!r}")
    return np.float32(scale)


def check_scale(flag: str, value: float) -> None:
    """``ConfigError`` naming ``flag`` unless ``value`` is a finite float32."""
    try:
        float32_scale(flag, value)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def row_sum(honest: np.ndarray) -> np.ndarray:
    """Float32 sum of the rows, added one row at a time in order (reproducible anywhere)."""
    acc = honest[0].copy()
    with np.errstate(over="ignore", invalid="ignore"):
        for row in honest[1:]:
            acc += row
    return acc


def row_mean(honest: np.ndarray) -> np.ndarray:
    """Float32 coordinate-wise mean: :func:`row_sum` divided by the row count."""
    return row_sum(honest) / np.float32(honest.shape[0])


def repeat(vector: np.ndarray, num_byzantine: int) -> np.ndarray:
    """``num_byzantine`` float32 copies of ``vector`` as rows."""
    return np.tile(vector.astype(np.float32, copy=False), (num_byzantine, 1))


def negated_copies(honest: np.ndarray, num_byzantine: int,
                   reduce: Callable[[np.ndarray], np.ndarray], what: str,
                   scale: float) -> np.ndarray:
    """``num_byzantine`` copies of ``-scale * reduce(honest)``, computed in float32 (an
    overflow gives -inf/+inf, still a Byzantine value); ``what`` names ``scale`` in errors."""
    check_honest(honest, num_byzantine)
    factor = float32_scale(what, scale)
    with np.errstate(over="ignore", invalid="ignore"):
        return repeat(reduce(honest) * -factor, num_byzantine)


def line_maximize(objective: Callable[[float], float], evals: int = 16, start: float = 0.0,
                  delta: float = 1.0, ratio: float = 0.8) -> float:
    """Best-effort argmax of ``objective`` over x >= 0 by exploration: the ``LineMaximize``
    attack optimiser of ByzFL (EPFL, ``byzfl.attacks.attack_optimizers``), which its
    optimised ALIE and FOE/IPM use, with its defaults (16 evaluations, start 0, step 1,
    contraction 0.8).

    Expansion: from ``start``, step ``delta`` right while the value improves (doubling the
    step each time); on the first step that does not improve, the step is multiplied by
    ``ratio`` and contraction begins: each evaluation moves the probe by the step towards
    the best point so far (bisecting towards the probe if it would go below 0), keeps the
    probe if it is strictly better, and multiplies the step by ``ratio``. Exactly
    ``evals`` evaluations; ties keep the earlier point, a NaN value never wins (it counts
    as -inf, so even a NaN at ``start`` is beaten by any number). Returns the best x
    evaluated.
    """
    if evals < 1:
        raise ValueError(f"line search needs evals >= 1, got {evals}")
    if not (math.isfinite(start) and start >= 0):
        raise ValueError(f"line search start must be finite and >= 0, got {start!r}")
    if not (math.isfinite(delta) and delta > 0):
        raise ValueError(f"line search delta must be finite and > 0, got {delta!r}")
    if not 0.5 < ratio < 1:
        raise ValueError(f"line search ratio must be in (0.5, 1), got {ratio!r}")
    def value(x: float) -> float:
        y = float(objective(x))
        return -math.inf if math.isnan(y) else y

    best_x = prop_x = float(start)
    best_y = value(best_x)
    evals -= 1
    while evals > 0:  # expansion
        prop_x = best_x + delta
        prop_y = value(prop_x)
        evals -= 1
        if prop_y > best_y:
            best_x, best_y = prop_x, prop_y
            delta *= 2
        else:
            delta *= ratio
            break
    while evals > 0:  # contraction
        if prop_x < best_x:
            prop_x += delta
        else:
            x = prop_x - delta
            while x < 0:
                x = (x + prop_x) / 2
            prop_x = x
        prop_y = value(prop_x)
        evals -= 1
        if prop_y > best_y:
            best_x, best_y = prop_x, prop_y
        delta *= ratio
    return best_x


@dataclass(frozen=True)
class Aim:
    """What an attack with ``reads_rule`` aims at: the aggregation of the run's servers.

    ``aggregate`` maps a round's (n, d) float32 matrix, rows ordered by worker id, to the
    (d,) float32 vector the servers would apply (every shard's pre-aggregation chain and
    rule, as configured); ``byzantine``: the rows the forged vectors take, in order (the
    honest vectors fill the others, in order).
    """

    aggregate: Callable[[np.ndarray], np.ndarray]
    byzantine: tuple[int, ...]

    def rows(self, honest: np.ndarray, forged: np.ndarray) -> np.ndarray:
        """The (n, d) matrix of a round with ``forged`` in the Byzantine rows."""
        n = honest.shape[0] + forged.shape[0]
        if (forged.shape[0] != len(self.byzantine) or len(set(self.byzantine)) !=
                len(self.byzantine) or not all(0 <= b < n for b in self.byzantine)):
            raise ValueError(f"aim has Byzantine rows {self.byzantine}, got "
                             f"{forged.shape[0]} forged and {honest.shape[0]} honest rows")
        mask = np.zeros(n, dtype=bool)
        mask[list(self.byzantine)] = True
        out = np.empty((n, honest.shape[1]), dtype=np.float32)
        out[list(self.byzantine)] = forged  # forged[k] in row byzantine[k], in any order
        out[~mask] = honest
        return out

    def distance(self, honest: np.ndarray, forged: np.ndarray) -> float:
        """ByzFL's objective: ``||Aggr(honest + forged) - mean(honest)||`` (float64)."""
        mean = honest.mean(axis=0, dtype=np.float64)
        out = np.asarray(self.aggregate(self.rows(honest, forged)), dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            return float(np.linalg.norm(out - mean))


# --------------------------------------------------------------------------- contract


@dataclass(frozen=True)
class Site:
    """Where a value-level attack strikes: one push (or PARAMS reply) of one shard."""

    seed: int
    round: int
    worker: int
    shard: int
    start: int  # global index of the shard's first coordinate
    num_workers: int
    what: str  # "push" or "params"


@dataclass(frozen=True)
class Attack:
    """Base of all attacks; subclasses are frozen dataclasses of their parameters."""

    name: ClassVar[str]
    summary: ClassVar[str]
    sites: ClassVar[frozenset[str]]  # WORKER and/or PROXY

    @classmethod
    def setting_roles(cls) -> frozenset[str]:
        """Processes that take this attack's parameters: where it runs, and the launchers."""
        return frozenset({CLUSTER, SIMULATE} | cls.sites)

    def check(self, num_workers: int, num_byzantine: int) -> None:
        """``ConfigError`` if the parameters do not fit: ranges come from the settings, and
        every float must be a finite float32 (the attacks compute in float32)."""
        check_ranges(self)
        for d in declared(type(self)):
            value = getattr(self, d.name)
            if d.kind is float and value is not None:
                check_scale(d.flag, value)

    def parameters(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ValueAttack(Attack):
    """Generalized model: corrupts single values of one push at a proxy."""

    sites: ClassVar[frozenset[str]] = frozenset({PROXY})

    def corrupt(self, values: np.ndarray, site: Site) -> tuple[np.ndarray, int]:
        """(the values to forward, the number of values changed)."""
        raise NotImplementedError


@dataclass(frozen=True)
class VectorAttack(Attack):
    """Classic model: forges whole vectors, by Byzantine workers or at a proxy.

    ``reads_honest``: the forged vectors depend on the honest ones (a proxy must then
    hold a whole round before forwarding any push of it). ``reads_rule``: :meth:`forge`
    also takes ``aim=`` (an :class:`Aim`: the run's aggregation); only Byzantine workers
    build one. ``trains``: the Byzantine worker computes its vector with the trainer on
    its own data, labels mapped by :meth:`relabel`; :meth:`forge` is not used.
    ``stateful``: :meth:`forge` also takes ``memory=`` (from :meth:`start_memory`, one
    per Byzantine worker), which it updates; only Byzantine workers keep one.
    """

    sites: ClassVar[frozenset[str]] = frozenset({WORKER, PROXY})
    reads_honest: ClassVar[bool] = True
    reads_rule: ClassVar[bool] = False
    trains: ClassVar[bool] = False
    stateful: ClassVar[bool] = False
    # f(honest, num_byzantine, rng, **parameters) -> (num_byzantine, d) float32
    function: ClassVar[Callable[..., np.ndarray]]

    def forge(self, honest: np.ndarray, num_byzantine: int, rng: np.random.Generator,
              num_workers: int) -> np.ndarray:
        """The ``(num_byzantine, d)`` float32 vectors the Byzantine workers send."""
        return type(self).function(honest, num_byzantine, rng, **self.parameters())

    def forge_at(self, honest: np.ndarray, num_byzantine: int, num_workers: int, seed: int,
                 stream: str, *coords: int, aim: Aim | None = None,
                 memory: Any = None) -> np.ndarray:
        """:meth:`forge` with the generator of stream ``<stream>`` at ``coords`` (and
        ``aim`` for an attack that ``reads_rule``, ``memory`` for one that is
        ``stateful``)."""
        rng = derive_rng(seed, stream, *coords)
        extra: dict[str, Any] = {}
        if self.reads_rule:
            if aim is None:
                raise ValueError(f"attack {self.name} searches against the run's rule: "
                                 "it needs an aim")
            extra["aim"] = aim
        if self.stateful:
            if memory is None:
                raise ValueError(f"attack {self.name} carries state from round to round: "
                                 "it needs its memory")
            extra["memory"] = memory
        # (the class says its forge takes them)
        forge = cast(Callable[..., np.ndarray], self.forge)
        return forge(honest, num_byzantine, rng, num_workers, **extra)

    def start_memory(self) -> Any:
        """A ``stateful`` attack's memory before its first round."""
        raise TypeError(f"attack {self.name} carries no state from round to round")

    def relabel(self, targets: Any, num_classes: int) -> Any:
        """The labels a ``trains`` attack computes its gradient on (default: unchanged)."""
        return targets


ATTACKS: Registry[type[Attack]] = Registry("attack", ConfigError, reserved={NO_ATTACK})
"""Every attack by name, in registration order."""

register_attack = ATTACKS.register
"""Class decorator: add an attack class to :data:`ATTACKS` under its ``name``."""


def attack_names(site: str) -> tuple[str, ...]:
    """``"none"`` and the attacks that can run at ``site`` (WORKER or PROXY)."""
    return (NO_ATTACK, *(n for n, cls in ATTACKS.items() if site in cls.sites))


def attack_class(name: str) -> type[Attack]:
    """The attack called ``name``; ``ConfigError`` listing the valid names."""
    return ATTACKS[name]
