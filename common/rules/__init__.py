"""Robust aggregation rules for the parameter server.

Implements the rules of Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant SGD"
(ICML 2018) and common baselines; each module of this package holds one rule, cites
its source, declares the run settings of its options (``Settings``) and registers it
(``@register_rule``), so adding a rule, with its options, is adding a file. A run's
pre-aggregation chain, rule and rule state are built together by
``common.rules.defence.Defence``. Usage::

    rule = make_rule("meamed", n=20, q=8)
    out = rule(G)  # G: (n, d) float32 torch.Tensor -> (d,) float32
"""

from common.registry import import_modules
from common.rules.base import (
    RULES,
    OptionSettings,
    Rule,
    RuleError,
    make_rule,
    register_rule,
    rule_class,
    rule_names,
)

import_modules(__name__, __path__, skip={"base", "defence", "kernels"})

__all__ = ["RULES", "OptionSettings", "Rule", "RuleError", "make_rule", "register_rule",
           "rule_class", "rule_names"]
