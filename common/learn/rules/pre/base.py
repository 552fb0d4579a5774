"""The contract every pre-aggregator shares, their registry, and the chain of them that
runs before the rule.

A pre-aggregator maps the (n, d) float32 matrix of a round to another (n', d) matrix,
which the next step (the next pre-aggregator, then the rule) aggregates: NNM and ARC
keep n rows, bucketing leaves ceil(n/s).  They compose with every rule: ``--pre arc,nnm
--rule trimmed-mean`` clips, then mixes, then trims.  Like a rule, a pre-aggregator
states its preconditions on (n, q) as a class method (``check``) and says how many rows
it leaves (``output_rows``), so a whole chain is validated with the rule at
configuration time without building anything (:func:`check_chain`).

q after a pre-aggregator: every step keeps q.  NNM and ARC leave row i in place of row
i; bucketing puts each input row in exactly one bucket, so at most q of its ceil(n/s)
buckets hold a Byzantine row, and the rule after it is checked with (ceil(n/s), q).  The
Byzantine *fraction* grows by up to a factor s, which is the price bucketing's analysis
(Karimireddy, He, Jaggi, ICLR 2022) states: it needs s * q/n below what the rule
tolerates.

Sharded clusters: a server sees only its shard's coordinates, so every vector-level
step (NNM's and ARC's norms and distances, like Krum's, GeoMed's, MDA's, SMEA's and
CAF's) runs on the shard's sub-vectors, independently on each server: a row may be a
"nearest neighbour" or be clipped on one shard and not on another.  Their guarantees,
stated for whole vectors, hold per shard (each shard's output is what the rule would
give on that sub-problem), not for the concatenated vector.

Inputs and outputs: like a rule, a step takes only an (n, d) float32 CPU tensor
(``RuleError`` otherwise, naming the step) and leaves float32 rows.  Non-finite values:
each module says how it treats them; a coordinate that is NaN in every input row stays
NaN in every output row (an all-NaN matrix gives all-NaN rows, which every rule then
aggregates to NaN, see ``common.learn.rules.base``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from common.conf.registry import Registry
from common.learn.rules.base import (
    RuleError,
    Step,
    check_declaration,
    check_matrix,
    option_defaults,
    rule_class,
)

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class RoundContext:
    """Where a round's rows come from: what seeds a random step (bucketing's shuffle),
    identical in a cluster's server and in the reference engine."""

    seed: int = 0
    round: int = 0
    shard: int = 0


class PreAggregator(Step):
    """Base of all pre-aggregators: preconditions in ``check``, the map in ``apply``.

    Subclasses set what every ``Step`` declares, override ``output_rows`` if they change
    the number of rows, and implement ``apply``.
    """

    @classmethod
    def output_rows(cls, n: int, **options: Any) -> int:
        """Rows left for the next step from ``n`` (checked options)."""
        return n

    def __init__(self, n: int, q: int, **options: Any) -> None:
        for key, value in type(self).check(n, q, **options).items():
            setattr(self, key, value)
        self.n, self.q = int(n), int(q)
        self.rows_out = type(self).output_rows(self.n, **{k: getattr(self, k)
                                                          for k in self.options})
        self.last_info: dict[str, Any] = {}

    def __call__(self, G: torch.Tensor, context: RoundContext) -> torch.Tensor:
        """Map the (n, d) float32 CPU tensor ``G`` (never modified) to (n', d) float32;
        ``RuleError`` for any other input, as a rule (``common.learn.rules.base.check_matrix``)."""
        import torch

        G = check_matrix(self.name, self.n, G)
        self.last_info = {}
        out = self.apply(G, context)
        return out if isinstance(out, torch.Tensor) else torch.from_numpy(out)

    def apply(self, G: torch.Tensor, context: RoundContext) -> Any:
        raise NotImplementedError


PRE_AGGREGATORS: Registry[type[PreAggregator]] = Registry("pre-aggregator", RuleError,
                                                          check=check_declaration)
"""Every pre-aggregator by name (a module of ``common.learn.rules.pre`` registers its own)."""

register_pre = PRE_AGGREGATORS.register
"""Class decorator: add a pre-aggregator class to :data:`PRE_AGGREGATORS`."""


def pre_names() -> list[str]:
    return sorted(PRE_AGGREGATORS)


def pre_class(name: str) -> type[PreAggregator]:
    """The pre-aggregator called ``name``; ``RuleError`` listing the valid names."""
    return PRE_AGGREGATORS[name]


def parse_chain(text: str) -> tuple[str, ...]:
    """``"arc, nnm"`` as ``("arc", "nnm")``; ``""`` or ``"none"``: no step.  Unknown names
    are a ``RuleError`` listing the valid ones."""
    names = tuple(p.strip() for p in text.split(",") if p.strip())
    if names == ("none",):
        return ()
    for name in names:
        pre_class(name)
    return names


def chain_rows(names: Sequence[str], n: int, options: Mapping[str, Mapping[str, Any]]) -> int:
    """Rows the chain leaves from n rows (options unchecked: defaults filled in)."""
    for name in names:
        cls = pre_class(name)
        n = cls.output_rows(n, **{**option_defaults(cls), **options.get(name, {})})
    return n


def check_chain(names: Sequence[str], rule: str, n: int, q: int,
                pre_options: Mapping[str, Mapping[str, Any]],
                rule_options: Mapping[str, Any]) -> int:
    """Check every step of the chain and then the rule, each with the rows the steps
    before it leave; the rows the rule gets.  ``RuleError`` naming the step, its rows
    and q."""
    rows = n
    for name in names:
        cls = pre_class(name)
        checked = cls.check(rows, q, **pre_options.get(name, {}))
        rows = cls.output_rows(rows, **checked)
    try:
        rule_class(rule).check(rows, q, **rule_options)
    except RuleError as exc:
        if rows == n:
            raise
        raise RuleError(f"{rule} gets {rows} rows after --pre {','.join(names)} (n={n}), "
                        f"with q={q}: {exc}") from None
    return rows


class Chain:
    """The pre-aggregators of a run, built for n input rows; ``rows_out`` for the rule."""

    def __init__(self, names: Sequence[str], n: int, q: int,
                 options: Mapping[str, Mapping[str, Any]]) -> None:
        self.steps: list[PreAggregator] = []
        rows = n
        for name in names:
            step = pre_class(name)(rows, q, **options.get(name, {}))
            self.steps.append(step)
            rows = step.rows_out
        self.n, self.rows_out = n, rows
        self.last_info: list[dict[str, Any]] = []

    def __bool__(self) -> bool:
        return bool(self.steps)

    def __call__(self, G: torch.Tensor, context: RoundContext) -> torch.Tensor:
        for step in self.steps:
            G = step(G, context).contiguous()
        self.last_info = [{"pre": s.name, **s.last_info} for s in self.steps]
        return G
