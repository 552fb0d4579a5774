"""Krum and Multi-Krum (Blanchard, El Mhamdi, Guerraoui, Stainer, NeurIPS 2017).

Used as baselines by Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant SGD"
(ICML 2018).  The Krum score of row i is the sum of its squared distances to its
n - q - 2 nearest other rows; Krum outputs the row with the lowest score.  Multi-Krum
outputs the average of the m rows with the lowest scores, the scores being computed
once on all n rows (the usual "m best by Krum score" reading, not m rounds of Krum with
removal; ``m`` defaults to n - q).  Both need 2q + 2 < n.

All distances come from one float64 Gram matrix (``kernels.gram64``).  Non-finite values:
a row holding any NaN or infinity is at +inf from every row, so it ranks after every
finite row and is never selected or averaged while a finite row is available; finite
rows are scored on their distances to finite rows only (if fewer than n - q - 2 other
rows are finite, on all of those).  Multi-Krum averages the finite rows among its m
best, so it never averages a non-finite row.  Ties go to the lowest row index.  If no
row is finite, both output the coordinate-wise median (MarMed) of all rows and set
``last_info["fallback"] = "marmed"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from common.conf.settings import setting
from common.learn.rules.base import (
    OptionSettings,
    Rule,
    RuleError,
    as_int,
    register_rule,
)
from common.learn.rules.marmed import coordinate_median

if TYPE_CHECKING:
    import torch


def krum_ranking(D2: np.ndarray, finite: np.ndarray, q: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows ordered by Krum score (finite rows first, ties by index) and the scores.

    ``D2`` are squared distances with +inf for non-finite rows (``kernels.squared_distances``);
    each finite row is scored on its ``max(n - q - 2, 0)`` nearest other finite rows;
    non-finite rows get +inf and come last, in index order.
    """
    n = D2.shape[0]
    rows = np.flatnonzero(finite)
    scores = np.full(n, np.inf)
    if rows.size:
        sub = D2[np.ix_(rows, rows)]
        others = sub[~np.eye(rows.size, dtype=bool)].reshape(rows.size, rows.size - 1)
        k = min(max(n - q - 2, 0), rows.size - 1)
        scores[rows] = np.sort(others, axis=1)[:, :k].sum(axis=1)
    order = np.concatenate([rows[np.argsort(scores[rows], kind="stable")], np.flatnonzero(~finite)])
    return order, scores


class KrumScored(Rule):
    """Rules that rank the rows by Krum score (needs 2q + 2 < n); a subclass picks from
    the ranking in ``choose``. If no row is finite, the output is MarMed."""

    needs = "2q+2 < n"
    precondition = staticmethod(lambda n, q: 2 * q + 2 < n)

    def aggregate(self, G: torch.Tensor) -> torch.Tensor | np.ndarray:
        from common.learn.rules.kernels import gram

        D2, finite = gram.squared_distances(gram.gram64(G))
        if not finite.any():
            self.last_info = {"selected": [], "fallback": "marmed"}
            return coordinate_median(G)
        order, scores = krum_ranking(D2, finite, self.q)
        return self.choose(G, order, scores, finite)

    def choose(self, G: torch.Tensor, order: np.ndarray, scores: np.ndarray,
               finite: np.ndarray) -> torch.Tensor:
        raise NotImplementedError


@register_rule
class Krum(KrumScored):
    """The row with the lowest Krum score; ``last_info["selected"]``, ``["score"]``."""

    name = "krum"
    summary = "the input with the smallest sum of squared distances to its n-q-2 nearest"

    def choose(self, G: torch.Tensor, order: np.ndarray, scores: np.ndarray,
               finite: np.ndarray) -> torch.Tensor:
        best = int(order[0])
        self.last_info = {"selected": [best], "score": float(scores[best])}
        return G[best].clone()


@register_rule
class MultiKrum(KrumScored):
    """Average of the ``m`` best rows by Krum score; ``last_info["selected"]``."""

    name = "multikrum"
    summary = "average of the m best by Krum score (`--multikrum-m`, default n-q)"
    options = ("m",)
    m: int

    @dataclass(frozen=True)
    class Settings(OptionSettings):
        m: int | None = setting(None, "Multi-Krum: number of vectors averaged (default n-q).",
                                flag="--multikrum-m", minimum=1)

    @classmethod
    def check(cls, n: int, q: int, **options: Any) -> dict[str, Any]:
        options = super().check(n, q, **options)
        m = n - q if options.get("m") is None else as_int(options["m"], "multikrum option m")
        if not 1 <= m <= n - q:
            raise RuleError(f"multikrum needs 1 <= m <= n-q, got m={m}, n={n}, q={q}")
        return {"m": m}

    def choose(self, G: torch.Tensor, order: np.ndarray, scores: np.ndarray,
               finite: np.ndarray) -> torch.Tensor:
        chosen = [int(i) for i in order[: self.m] if finite[i]]
        self.last_info = {"selected": chosen, "scores": [float(scores[i]) for i in chosen]}
        if not finite.all():  # a zero weight would still turn a NaN row's values into NaN
            return G[chosen].mean(0)
        weights = G.new_zeros(self.n)
        weights[chosen] = 1.0 / len(chosen)
        return weights @ G  # one BLAS pass over G, no copy of the chosen rows
