"""Robust aggregation rules for the parameter server.

Implements the rules of Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant SGD"
(ICML 2018) and common baselines; each module of this package holds one rule, cites
its source and registers it (``@register_rule``), so adding a rule is adding a file.
Usage::

    rule = make_rule("meamed", n=20, q=8)
    out = rule(G)  # G: (n, d) float32 torch.Tensor -> (d,) float32
"""

import importlib
import pkgutil

from common.rules.base import (
    RULES,
    Rule,
    RuleError,
    make_rule,
    register_rule,
    rule_class,
    rule_names,
)

_NOT_RULES = {"base", "kernels"}
for _module in pkgutil.iter_modules(__path__):
    if _module.name not in _NOT_RULES:
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["RULES", "Rule", "RuleError", "make_rule", "register_rule", "rule_class",
           "rule_names"]
