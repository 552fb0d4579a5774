"""MarMed: the coordinate-wise (marginal) median.

Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant SGD" (ICML 2018), Definition of
MarMed: ``out[j] = median_i G[i, j]``; for even n the mean of the two middle values.
Dimensional Byzantine resilient while fewer than half the values of each coordinate are
Byzantine; q is accepted (0 <= q < n) and not used.

Non-finite values: NaN is read as +inf on even rows and -inf on odd rows (see
``common.learn.rules.kernels``), so while fewer than n/2 values of a coordinate are NaN or
+-inf, the output lies within the range of its finite values and is never NaN.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.learn.rules.base import Rule, register_rule

if TYPE_CHECKING:
    import numpy as np
    import torch


def coordinate_median(G: torch.Tensor) -> np.ndarray:
    """Coordinate-wise median of a contiguous (n, d) float32 CPU tensor."""
    from common.learn.rules.kernels import networks

    return networks.coordinate_median(G.numpy())


@register_rule
class MarMed(Rule):
    """Coordinate-wise median by a vectorised sorting network (``kernels``)."""

    name = "marmed"
    summary = "coordinate-wise median"
    coordinatewise = True

    def aggregate(self, G: torch.Tensor) -> np.ndarray:
        return coordinate_median(G)
