"""The contract every aggregation rule shares: ``RuleError``, argument checks, ``Rule``,
and the registry of rules by name.

Rules follow Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant SGD" (ICML 2018): a
rule maps the (n, d) float32 matrix of n workers' gradients to one (d,) gradient, with at
most q Byzantine values per coordinate (or q Byzantine rows, for the classic model).

A rule's preconditions are a class method (:meth:`Rule.check`), so a configuration is
validated without building a rule; the options a run sets are declared by the rule as
settings (:class:`OptionSettings`), like an attack's parameters.  The compiled kernels
(numba) and torch are imported only when a rule first aggregates (each imports the
modules of ``common.learn.rules.kernels`` it uses in its ``aggregate``), so processes that only
validate settings (the launcher, the proxy) stay light.

Sharding: each server aggregates its own shard, the (n, d_s) rows of its coordinates.
Coordinate-wise rules (MarMed, MeaMed, trimmed mean) give exactly what they would give
on whole vectors.  Vector-level rules and pre-aggregators (Krum, Multi-Krum, Medoid,
GeoMed, Bulyan's selection, MDA, SMEA, CAF, centered clipping; NNM and ARC in
``common.learn.rules.pre``) measure distances, norms and covariances on the shard's
sub-vectors only, independently on every server: a worker can be selected, mixed or
clipped on one shard and not on another.  Their guarantees, stated for whole vectors,
hold per shard (each shard's output against that shard's honest sub-vectors); with
one shard they are the published rules exactly.

Non-finite values: each rule's module says how it treats NaN and infinities.  Common to
every rule: a coordinate in which every input value is NaN comes out NaN (so an all-NaN
matrix gives an all-NaN vector), as the mean gives: a rule puts no infinity where it was
given no value (:meth:`Rule.__call__` turns any non-finite output coordinate whose input
is all NaN into NaN).  The one exception is centered clipping, whose output stays its
previous aggregate (finite) when no row is finite: a non-finite row never moves it.
Pre-aggregators (``common.learn.rules.pre``) keep such a coordinate all NaN in every row they
leave.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from common.conf.registry import Registry
from common.conf.settings import ROLES, Declared, declared

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


def as_positive_int(value: Any, what: str) -> int:
    """``value`` as an int >= 1 (see :func:`as_int`)."""
    number = as_int(value, what)
    if number < 1:
        raise RuleError(f"{what} must be >= 1, got {number}")
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


def check_matrix(name: str, n: int, G: Any) -> torch.Tensor:
    """``G`` as a contiguous CPU float32 (n, d) tensor with d >= 1, or ``RuleError`` naming
    ``name`` (the rule or pre-aggregator) and what is wrong."""
    import torch

    if not isinstance(G, torch.Tensor):
        raise RuleError(f"{name} expects a torch.Tensor, got {type(G).__name__}")
    if G.dtype != torch.float32:
        raise RuleError(f"{name} expects dtype float32, got {G.dtype}")
    if G.ndim != 2:
        raise RuleError(f"{name} expects a 2-D (n, d) tensor, got shape {tuple(G.shape)}")
    if G.shape[0] != n:
        raise RuleError(f"{name} was built for n={n} rows, got {G.shape[0]}")
    if G.shape[1] == 0:
        raise RuleError(f"{name} expects d >= 1 coordinates, got d=0")
    if G.device.type != "cpu":
        raise RuleError(f"{name} expects a CPU tensor, got device {G.device}")
    if G.is_contiguous() and not G.requires_grad:
        return G
    return G.detach().contiguous()


def nan_where_all_nan(G: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out`` with NaN in each coordinate where every row of ``G`` is NaN (a copy if any
    changes); checked only when ``out`` holds a non-finite value, so a finite round pays
    one pass over the (d,) output (a kernel's, allocating nothing: a tenth of torch's
    ``isfinite`` cost here, and no (d,) mask as numpy's)."""
    import torch

    from common.learn.rules.kernels.reductions import nonfinite_counts

    values = out.detach().numpy()
    if nonfinite_counts(values, [(0, values.size)])[0] == 0:
        return out
    empty = torch.isnan(G).all(dim=0)
    if not bool(empty.any()):
        return out
    out = out.clone()
    out[empty] = float("nan")
    return out


@dataclass(frozen=True)
class OptionSettings:
    """Base of the ``Settings`` of a rule or a pre-aggregator: a frozen dataclass whose
    fields are settings (``common.conf.settings.setting``), each named after the option it
    gives and with its own flag (centered clipping's ``tau`` is ``--cc-tau``).

    They are run settings: ``RunConfig`` holds each under its flag's name (``cc_tau``),
    every role takes it and it enters the run hash (``common.learn.rules.defence``).
    """

    @classmethod
    def setting_roles(cls) -> frozenset[str]:
        return frozenset(ROLES)


def option_settings(cls: type[Step]) -> tuple[Declared, ...]:
    """The declared settings of a rule's or a pre-aggregator's options (none: ``()``)."""
    return () if cls.Settings is None else declared(cls.Settings)


def option_defaults(cls: type[Step]) -> dict[str, Any]:
    """The defaults of the options ``cls`` declares as settings, by option name."""
    return {d.name: d.default for d in option_settings(cls)}


def check_declaration(cls: type[Step]) -> None:
    """``TypeError`` unless every setting ``cls`` declares is one of its ``options``."""
    extra = [d.name for d in option_settings(cls) if d.name not in cls.options]
    if extra:
        raise TypeError(f"{cls.name} declares settings {extra} that are not among its "
                        f"options {cls.options}")


class Step:
    """What a rule and a pre-aggregator share: a ``name``, a one-line ``summary`` (shown in
    the README), a precondition on (n, q) with its text ``needs``, ``options`` (the
    keyword options accepted; ``check`` validates them) and the ``Settings`` of those a
    run sets (their defaults are the options' defaults)."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    needs: ClassVar[str] = ""
    # a subclass sets staticmethod(lambda n, q: ...): a plain function would bind to self
    precondition: ClassVar[staticmethod[[int, int], bool] | None] = None
    options: ClassVar[tuple[str, ...]] = ()
    Settings: ClassVar[type[OptionSettings] | None] = None
    n: int
    q: int

    @classmethod
    def check(cls, n: int, q: int, **options: Any) -> dict[str, Any]:
        """Validate n, q and the option names; return the options with the defaults of
        those declared as settings filled in (a subclass checks their values).

        Raises ``RuleError`` naming the rule (or pre-aggregator), n and q.
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
        return {**option_defaults(cls), **options}

    def __repr__(self) -> str:
        extra = "".join(f", {k}={getattr(self, k)!r}" for k in self.options)
        return f"{type(self).__name__}(n={self.n}, q={self.q}{extra})"


class Rule(Step):
    """Base of all rules: preconditions in ``check``, the math in ``aggregate``.

    Subclasses set what every ``Step`` declares, ``stateful`` if they carry state from
    round to round (``get_state``/``set_state``), and implement ``aggregate``, which
    may return a numpy array or a tensor.
    """

    stateful: ClassVar[bool] = False
    # Output coordinate j is computed from column j of G alone, the same bit for bit
    # whatever the other columns: aggregating a matrix's column blocks one by one gives
    # the blocks of aggregating it whole, so a server process aggregates the shards it
    # hosts in one call (``server/group.py``). The mean is coordinate-wise in exact
    # arithmetic, but torch's vectorised sum rounds with the width: not marked.
    coordinatewise: ClassVar[bool] = False

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

        ``G`` is never modified; a non-contiguous ``G`` is copied first.  A coordinate
        that is NaN in every row comes out NaN (see the module's docstring).
        """
        import torch

        X = self.validate_input(G)
        self.last_info = {}
        out = self.aggregate(X)
        out = out if isinstance(out, torch.Tensor) else torch.as_tensor(out)
        if tuple(out.shape) != (X.shape[1],) or out.dtype != torch.float32:
            raise RuleError(f"rule {self.name} returned {tuple(out.shape)} {out.dtype} for a "
                            f"{tuple(X.shape)} float32 matrix; a rule returns "
                            f"({X.shape[1]},) float32")
        return nan_where_all_nan(X, out)

    def validate_input(self, G: Any) -> torch.Tensor:
        """``G`` as a contiguous CPU float32 (n, d) tensor with d >= 1, or ``RuleError``."""
        return check_matrix(self.name, self.n, G)

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


RULES: Registry[type[Rule]] = Registry("rule", RuleError, check=check_declaration)
"""Every rule by name; a module of this package adds its rule with :func:`register_rule`."""

register_rule = RULES.register
"""Class decorator: add a rule class to :data:`RULES` under its ``name``."""


def rule_names() -> list[str]:
    """The registered rule names, sorted."""
    return sorted(RULES)


def rule_class(name: str) -> type[Rule]:
    """The rule called ``name``; ``RuleError`` listing the valid names."""
    return RULES[name]


def make_rule(name: str, n: int, q: int, **options: Any) -> Rule:
    """Build rule ``name`` for n workers and q Byzantine values; checks preconditions now.

    Raises ``RuleError`` for an unknown name or option, or unmet preconditions on n, q
    and the options.
    """
    return rule_class(name)(n, q, **options)
