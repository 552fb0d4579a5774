"""Pre-aggregators: maps of a round's (n, d) matrix applied before the rule (``--pre``).

Each module of this package holds one pre-aggregator, cites its source, declares the run
settings of its options (``Settings``) and registers it (``@register_pre``); see
``common.learn.rules.pre.base`` for the contract, the chain, and what q means after a step.
A run's chain is built with its rule by ``common.learn.rules.defence.Defence``.  Usage::

    chain = Chain(("arc", "nnm"), n=20, q=4, options={})
    rows = chain(G, RoundContext(seed, round, shard))   # (n, d) -> (chain.rows_out, d)
"""

# The catalogue: every built-in pre-aggregator, a module each, which registers it
# when imported (``ps-list`` shows the registry, in the order of their first import).
from common.learn.rules.pre import (
    arc,
    bucketing,
    nnm,
)
from common.learn.rules.pre.base import (
    PRE_AGGREGATORS,
    Chain,
    PreAggregator,
    RoundContext,
    chain_rows,
    check_chain,
    parse_chain,
    pre_class,
    pre_names,
    register_pre,
)

CATALOGUE = (
    arc, bucketing, nnm,
)

__all__ = ["PRE_AGGREGATORS", "Chain", "PreAggregator", "RoundContext", "chain_rows",
           "check_chain", "parse_chain", "pre_class", "pre_names", "register_pre"]
