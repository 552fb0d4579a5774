"""The contract every aggregation rule shares: ``RuleError``, argument checks, ``Rule``,
and the registry of rules by name.

Rules follow Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant SGD" (ICML 2018): a
rule maps the (n, d) float32 matrix of n workers' gradients to one (d,) gradient, with at
most q Byzantine values per coordinate (or q Byzantine rows, for the classic model).

A rule's preconditions are a class method (:meth:`Rule.check`), so a configuration is
validated without building a rule; the compiled kernels (numba) and torch are imported
only when a rule first aggregates (each imports the modules of ``common.rules.kernels``
it uses in its ``aggregate``), so processes that only validate settings (the launcher,
the proxy) stay light.

Sharding: each server aggregates its own shard, the (n, d_s) rows of its coordinates.
Coordinate-wise rules (MarMed, MeaMed, trimmed mean) give exactly what they would give
on whole vectors.  Vector-level rules and pre-aggregators (Krum, Multi-Krum, Medoid,
GeoMed, Bulyan's selection, MDA, SMEA, CAF, centered clipping; NNM and ARC in
``common.rules.pre``) measure distances, norms and covariances on the shard's
sub-vectors only, independently on every server: a worker can be selected, mixed or
clipped on one shard and not on another.  Their guarantees, stated for whole vectors,
hold per shard (each shard's output against that shard's honest sub-vectors); with
one shard they are the published rules exactly.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import numpy as np
    import torch


class RuleError(ValueError):
    """A rule was asked for something it cannot do (bad name, option, n, q or input)."""


def as_int(value: Any, what: str) -> int:
    """``value`` as an int (bools and non-integral numbers are refused)."""
    if isinstance(value, bool):
        raise RuleError(f"{what} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise RuleError(f"{what} must be an integer, got {value!r}") from None


def as_positive_float(value: Any, what: str) -> float:
    """``value`` as a finite float > 0."""
    if isinstance(value, bool):
        raise RuleError(f"{what} must be a positive number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise RuleError(f"{what} must be a positive number, got {value!r}") from None
    if not (math.isfinite(number) and number > 0):
        raise RuleError(f"{what} must be a positive number, got {value!r}")
    return number


def median_bound(n: int) -> int:
    """Largest q with dimensional Byzantine resilience: ``ceil(n/2) - 1``."""
    return (n + 1) // 2 - 1


def check_subsets(name: str, n: int, q: int, cap: int) -> None:
    """``RuleError`` if an exhaustive search over the C(n, q) subsets of n - q rows would
    exceed ``cap`` subsets (MDA, SMEA), naming both numbers."""
    count = math.comb(n, q)
    if count > cap:
        raise RuleError(f"{name} searches the C(n, q) = C({n}, {q}) = {count} subsets of "
                        f"n-q = {n - q} rows; it is capped at {cap} (n={n}, q={q}): lower q "
                        f"or n, or use a polynomial rule")


class Rule:
    """Base of all rules: preconditions in ``check``, the math in ``aggregate``.

    Subclasses set ``name``, a one-line ``summary`` (shown in the README), their
    precondition on (n, q) with its text ``needs``, ``options`` (the keyword options
    they accept; ``check`` validates them), and implement ``aggregate``, which may
    return a numpy array or a tensor.
    """

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    needs: ClassVar[str] = ""
    precondition: ClassVar[Callable[[int, int], bool] | None] = None
    options: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def check(cls, n: int, q: int, **options: Any) -> dict[str, Any]:
        """Validate n, q and the options; return the options with defaults filled in.

        Raises ``RuleError`` naming the rule, n and q.
        """
        n, q = as_int(n, "n"), as_int(q, "q")
        if n < 1:
            raise RuleError(f"{cls.name} needs n >= 1, got n={n}, q={q}")
        if not 0 <= q < n:
            raise RuleError(f"{cls.name} needs 0 <= q < n, got n={n}, q={q}")
        if cls.precondition is not None and not cls.precondition(n, q):
            raise RuleError(f"{cls.name} needs {cls.needs}, got n={n}, q={q}")
        unknown = sorted(set(options) - set(cls.options))
        if unknown:
            valid = ", ".join(cls.options) or "none"
            raise RuleError(
                f"unknown option(s) for {cls.name}: {', '.join(unknown)}; valid: {valid}")
        return options

    @classmethod
    def default_q(cls, n: int) -> int:
        """The q used when none is given: the largest Krum allows, (n-3)//2 (the paper's
        q = 8 for n = 20), never negative."""
        return max(0, (n - 3) // 2)

    def __init__(self, n: int, q: int, **options: Any) -> None:
        for key, value in type(self).check(n, q, **options).items():
            setattr(self, key, value)
        self.n, self.q = int(n), int(q)
        self.last_info: dict[str, Any] = {}

    def __call__(self, G: torch.Tensor) -> torch.Tensor:
        """Aggregate the (n, d) float32 matrix ``G`` into a (d,) float32 tensor.

        ``G`` is never modified; a non-contiguous ``G`` is copied first.
        """
        import torch

        X = self.validate_input(G)
        self.last_info = {}
        out = self.aggregate(X)
        return out if isinstance(out, torch.Tensor) else torch.from_numpy(out)

    def validate_input(self, G: Any) -> torch.Tensor:
        """``G`` as a contiguous CPU float32 (n, d) tensor with d >= 1, or ``RuleError``."""
        import torch

        if not isinstance(G, torch.Tensor):
            raise RuleError(f"{self.name} expects a torch.Tensor, got {type(G).__name__}")
        if G.dtype != torch.float32:
            raise RuleError(f"{self.name} expects dtype float32, got {G.dtype}")
        if G.ndim != 2:
            raise RuleError(f"{self.name} expects a 2-D (n, d) tensor, got shape {tuple(G.shape)}")
        if G.shape[0] != self.n:
            raise RuleError(f"{self.name} was built for n={self.n} rows, got {G.shape[0]}")
        if G.shape[1] == 0:
            raise RuleError(f"{self.name} expects d >= 1 coordinates, got d=0")
        if G.device.type != "cpu":
            raise RuleError(f"{self.name} expects a CPU tensor, got device {G.device}")
        return G.detach().contiguous()

    def aggregate(self, G: torch.Tensor) -> torch.Tensor | np.ndarray:
        """The rule itself, on a validated contiguous (n, d) float32 CPU tensor."""
        raise NotImplementedError

    def get_state(self) -> dict[str, np.ndarray]:
        """The state the next round needs (``stateful`` rules); never modified afterwards."""
        return {}

    def set_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Continue from ``state`` (from ``get_state``, or a checkpoint; empty: the start)."""
        if state:
            raise RuleError(f"{self.name} keeps no state, got {sorted(state)}")

    def __repr__(self) -> str:
        extra = "".join(f", {k}={getattr(self, k)!r}" for k in self.options)
        return f"{type(self).__name__}(n={self.n}, q={self.q}{extra})"


RULES: dict[str, type[Rule]] = {}
"""Every rule by name; a module of this package adds its rule with :func:`register_rule`."""


def register_rule(cls: type[Rule]) -> type[Rule]:
    """Class decorator: add ``cls`` to :data:`RULES` under ``cls.name``."""
    if cls.name in RULES and RULES[cls.name] is not cls:
        raise ValueError(f"two rules are called {cls.name!r}")
    RULES[cls.name] = cls
    return cls


def rule_names() -> list[str]:
    """The registered rule names, sorted."""
    return sorted(RULES)


def rule_class(name: str) -> type[Rule]:
    """The rule called ``name``; ``RuleError`` listing the valid names."""
    factory = RULES.get(name) if isinstance(name, str) else None
    if factory is None:
        raise RuleError(f"unknown rule {name!r}; valid rules: {', '.join(rule_names())}")
    return factory


def make_rule(name: str, n: int, q: int, **options: Any) -> Rule:
    """Build rule ``name`` for n workers and q Byzantine values; checks preconditions now.

    Raises ``RuleError`` for an unknown name or option, or unmet preconditions on n, q
    and the options.
    """
    return rule_class(name)(n, q, **options)
