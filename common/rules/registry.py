"""The registry of aggregation rules: one explicit name -> class dict, and ``make_rule``.

Rules of Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant SGD" (ICML 2018) (mean,
medoid, geomed, marmed, meamed) and the baselines krum, multikrum, trimmed-mean and
bulyan.
"""

from __future__ import annotations

from typing import Any

from common.rules.bulyan import Bulyan
from common.rules.geomed import GeoMed
from common.rules.krum import Krum, MultiKrum
from common.rules.marmed import MarMed
from common.rules.meamed import MeaMed
from common.rules.mean import Mean
from common.rules.medoid import Medoid
from common.rules.trimmed_mean import TrimmedMean
from common.rules.validation import Rule, RuleError

RULES: dict[str, type[Rule]] = {
    "mean": Mean,
    "medoid": Medoid,
    "krum": Krum,
    "multikrum": MultiKrum,
    "geomed": GeoMed,
    "marmed": MarMed,
    "meamed": MeaMed,
    "trimmed-mean": TrimmedMean,
    "bulyan": Bulyan,
}


def rule_names() -> list[str]:
    """The registered rule names, sorted."""
    return sorted(RULES)


def make_rule(name: str, n: int, q: int, **options: Any) -> Rule:
    """Build rule ``name`` for n workers and q Byzantine values; checks preconditions now.

    Raises ``RuleError`` for an unknown name or option, or unmet preconditions on n, q
    and the options.
    """
    factory = RULES.get(name) if isinstance(name, str) else None
    if factory is None:
        raise RuleError(f"unknown rule {name!r}; valid rules: {', '.join(rule_names())}")
    unknown = sorted(set(options) - set(factory.options))
    if unknown:
        valid = ", ".join(factory.options) or "none"
        raise RuleError(f"unknown option(s) for {name}: {', '.join(unknown)}; valid: {valid}")
    return factory(n, q, **options)
