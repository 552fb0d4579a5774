"""Trimmed mean: per coordinate, drop the q largest and q smallest values, average the rest.

The coordinate-wise trimmed mean (Yin, Chen, Ramchandran, Bartlett, ICML 2018), a
baseline next to MarMed and MeaMed of Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant
SGD" (ICML 2018).  Needs 0 <= q <= ceil(n/2) - 1, so that n - 2q >= 1 values remain.

Non-finite values: NaN is read as +inf on even rows and -inf on odd rows (see
``common.learn.rules.kernels``); with at most q non-finite values in a coordinate they are all
trimmed and the output is finite, within the range of the finite values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.learn.rules.base import Rule, median_bound, register_rule

if TYPE_CHECKING:
    import numpy as np
    import torch


@register_rule
class TrimmedMean(Rule):
    """Coordinate-wise trimmed mean by a vectorised sorting network (``kernels``)."""

    name = "trimmed-mean"
    summary = "per coordinate, drop the q largest and q smallest, average the rest"
    coordinatewise = True
    needs = "q <= ceil(n/2)-1"
    precondition = staticmethod(lambda n, q: q <= median_bound(n))  # n - 2q >= 1 remain

    def aggregate(self, G: torch.Tensor) -> np.ndarray:
        from common.learn.rules.kernels import networks

        return networks.coordinate_trimmed_mean(G.numpy(), self.q)
