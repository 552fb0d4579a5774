"""Bulyan (El Mhamdi, Guerraoui, Rouault, "The Hidden Vulnerability of Distributed
Learning in Byzantium", ICML 2018), a baseline next to the rules of Xie, Koyejo, Gupta,
"Generalized Byzantine-tolerant SGD" (ICML 2018).

Selection: theta = n - 2q rows chosen by repeated Krum; each round scores the remaining
rows with Krum (``max(r - q - 2, 0)`` nearest neighbours among the r remaining rows) and
moves the best one to the selection.  Aggregation: per coordinate, the mean of the
beta = theta - 2q selected values nearest to their median (the MeaMed window of
``kernels``, ties keeping the lower value).  Needs n >= 4q + 3.

Non-finite values: a row holding any NaN or infinity ranks after every finite row in
each Krum round (see ``krum``), so it is selected only when fewer than theta rows are
finite.  In the coordinate phase NaN reads as +inf on even and -inf on odd selected
rows, and with at most 2q non-finite selected values in a coordinate the output stays
finite (beta values nearer the median remain).  ``last_info["selected"]``: the selected
rows in selection order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from common.learn.rules.base import Rule, register_rule
from common.learn.rules.krum import krum_ranking

if TYPE_CHECKING:
    import torch


@register_rule
class Bulyan(Rule):
    """Repeated-Krum selection, then a coordinate-wise mean around the median."""

    name = "bulyan"
    summary = "Krum selection of n-2q, then trimmed around the median"
    needs = "n >= 4q+3"
    precondition = staticmethod(lambda n, q: n >= 4 * q + 3)

    @classmethod
    def default_q(cls, n: int) -> int:
        """(n-3)//4, the largest q that Bulyan's n >= 4q+3 allows; never negative."""
        return max(0, (n - 3) // 4)

    def __init__(self, n: int, q: int) -> None:
        super().__init__(n, q)
        self.theta = self.n - 2 * self.q
        self.beta = self.theta - 2 * self.q

    def aggregate(self, G: torch.Tensor) -> np.ndarray:
        from common.learn.rules.kernels import gram, networks

        D2, finite = gram.squared_distances(gram.gram64(G))
        remaining = np.arange(self.n)
        selected: list[int] = []
        for _ in range(self.theta):
            sub = np.ix_(remaining, remaining)
            order, _ = krum_ranking(D2[sub], finite[remaining], self.q)
            best = remaining[order[0]]
            selected.append(int(best))
            remaining = remaining[remaining != best]
        self.last_info = {"selected": selected}
        rows = np.array(selected, dtype=np.int64)
        return networks.coordinate_window_mean(G.numpy(), self.beta, rows)
