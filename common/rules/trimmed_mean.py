"""Trimmed mean: per coordinate, drop the q largest and q smallest values, average the rest.

The coordinate-wise trimmed mean (Yin, Chen, Ramchandran, Bartlett, ICML 2018), a
baseline next to MarMed and MeaMed of Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant
SGD" (ICML 2018).  Needs 0 <= q <= ceil(n/2) - 1, so that n - 2q >= 1 values remain.

Non-finite values: NaN is read as +inf on even rows and -inf on odd rows (see
``common.rules.kernels``); with at most q non-finite values in a coordinate they are all
trimmed and the output is finite, within the range of the finite values.
"""

from __future__ import annotations

import torch

from common.rules import kernels
from common.rules.validation import Rule, RuleError, median_bound


class TrimmedMean(Rule):
    """Coordinate-wise trimmed mean by a vectorised sorting network (``kernels``)."""

    name = "trimmed-mean"

    def __init__(self, n: int, q: int) -> None:
        super().__init__(n, q)
        if self.q > median_bound(self.n):
            raise RuleError(
                f"trimmed-mean needs q <= ceil(n/2)-1 (n - 2q >= 1), got n={self.n}, q={self.q}"
            )

    def aggregate(self, G: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(kernels.coordinate_trimmed_mean(G.numpy(), self.q))
