"""Robust aggregation rules for the parameter server.

Implements the rules of Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant SGD"
(ICML 2018) and common baselines; each module cites its source.  Usage::

    rule = make_rule("meamed", n=20, q=8)
    out = rule(G)  # G: (n, d) float32 torch.Tensor -> (d,) float32
"""

from common.rules.bulyan import Bulyan
from common.rules.geomed import GeoMed
from common.rules.krum import Krum, MultiKrum
from common.rules.marmed import MarMed
from common.rules.meamed import MeaMed
from common.rules.mean import Mean
from common.rules.medoid import Medoid
from common.rules.registry import RULES, make_rule, rule_names
from common.rules.trimmed_mean import TrimmedMean
from common.rules.validation import Rule, RuleError

__all__ = [
    "RULES",
    "Bulyan",
    "GeoMed",
    "Krum",
    "MarMed",
    "MeaMed",
    "Mean",
    "Medoid",
    "MultiKrum",
    "Rule",
    "RuleError",
    "TrimmedMean",
    "make_rule",
    "rule_names",
]
