"""Mean: the coordinate-wise average of the n inputs.

The baseline of Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant SGD" (ICML 2018):
neither classic nor dimensional Byzantine resilient.  A single NaN, infinity or huge
value in a coordinate propagates to the output, which is the paper's point, so no
non-finite value is filtered here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.learn.rules.base import Rule, register_rule

if TYPE_CHECKING:
    import torch


@register_rule
class Mean(Rule):
    """``out[j] = (1/n) sum_i G[i, j]``; q is accepted (0 <= q < n) and ignored."""

    name = "mean"
    summary = "coordinate-wise average"

    def aggregate(self, G: torch.Tensor) -> torch.Tensor:
        return G.mean(0)
