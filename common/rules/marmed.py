"""MarMed: the coordinate-wise (marginal) median.

Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant SGD" (ICML 2018), Definition of
MarMed: ``out[j] = median_i G[i, j]``; for even n the mean of the two middle values.
Dimensional Byzantine resilient while fewer than half the values of each coordinate are
Byzantine; q is accepted (0 <= q < n) and not used.

Non-finite values: NaN is read as +inf on even rows and -inf on odd rows (see
``common.rules.kernels``), so while fewer than n/2 values of a coordinate are NaN or
+-inf, the output lies within the range of its finite values and is never NaN.
"""

from __future__ import annotations

import torch

from common.rules import kernels
from common.rules.validation import Rule


def coordinate_median(G: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise median of a contiguous (n, d) float32 CPU tensor."""
    return torch.from_numpy(kernels.coordinate_median(G.numpy()))


class MarMed(Rule):
    """Coordinate-wise median by a vectorised sorting network (``kernels``)."""

    name = "marmed"

    def aggregate(self, G: torch.Tensor) -> torch.Tensor:
        return coordinate_median(G)
