"""MeaMed: per coordinate, the mean of the n - q values nearest to the median.

Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant SGD" (ICML 2018), Definition of
MeaMed: with ``med_j`` the coordinate-wise median (mean of the two middle values for
even n), ``out[j]`` is the mean of the n - q values ``G[i, j]`` with the smallest
``|G[i, j] - med_j|``, the median itself included.  Needs 0 <= q <= ceil(n/2) - 1
(dimensional Byzantine resilience).

Ties, deterministically: distances are float32 ``|x - med|``; when a value below the
median and a value above it are equally far, the one below is kept.  The kept values
always form a contiguous window of the sorted column (equal values are interchangeable).

Non-finite values: NaN is read as +inf on even rows and -inf on odd rows (see
``common.learn.rules.kernels``); infinities are farther than any finite value, so with at most
q non-finite values in a coordinate they are all dropped and the output is finite.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.learn.rules.base import Rule, median_bound, register_rule

if TYPE_CHECKING:
    import numpy as np
    import torch


@register_rule
class MeaMed(Rule):
    """Mean around the median, by a vectorised sorting network (``kernels``)."""

    name = "meamed"
    summary = "per coordinate, mean of the n-q values nearest the median"
    coordinatewise = True
    needs = "q <= ceil(n/2)-1"
    precondition = staticmethod(lambda n, q: q <= median_bound(n))

    def aggregate(self, G: torch.Tensor) -> np.ndarray:
        from common.learn.rules.kernels import networks

        return networks.coordinate_window_mean(G.numpy(), self.n - self.q)
