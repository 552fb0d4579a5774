"""Robust aggregation rules for the parameter server.

Implements the rules of Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant SGD"
(ICML 2018) and common baselines; each module of this package holds one rule, cites
its source, declares the run settings of its options (``Settings``) and registers it
(``@register_rule``), so adding a rule, with its options, is adding a file and naming
it in ``CATALOGUE`` below. A run's
pre-aggregation chain, rule and rule state are built together by
``common.learn.rules.defence.Defence``. Usage::

    rule = make_rule("meamed", n=20, q=8)
    out = rule(G)  # G: (n, d) float32 torch.Tensor -> (d,) float32
"""

# The catalogue: every built-in rule, a module each, which registers it
# when imported (``ps-list`` shows the registry, in the order of their first import).
from common.learn.rules import (
    bulyan,
    caf,
    centered_clipping,
    geomed,
    krum,
    marmed,
    mda,
    meamed,
    mean,
    medoid,
    smea,
    trimmed_mean,
)
from common.learn.rules.base import (
    RULES,
    OptionSettings,
    Rule,
    RuleError,
    make_rule,
    register_rule,
    rule_class,
    rule_names,
)

CATALOGUE = (
    bulyan, caf, centered_clipping, geomed, krum, marmed, mda, meamed, mean, medoid, smea,
    trimmed_mean,
)

__all__ = ["RULES", "OptionSettings", "Rule", "RuleError", "make_rule", "register_rule",
           "rule_class", "rule_names"]
