"""Bucketing (Karimireddy, He, Jaggi, "Byzantine-Robust Learning on Heterogeneous
Datasets via Bucketing", ICLR 2022, Algorithm 1).

The rows are shuffled with a random permutation pi and averaged in buckets of s:
bucket b is the mean of rows pi(b s), ..., pi(min((b+1) s, n) - 1), so the rule sees
ceil(n/s) rows (the last bucket holds the n mod s rows left, if any).  s is
``--bucket-size`` (default 2, the paper's choice in its experiments), 1 <= s <= n.

The permutation is drawn from the stream ``derive_rng(seed, "bucketing", round, shard)``
(``common.learn.seeding``): a cluster's server and the reference engine shuffle alike, bit for
bit, and a shard's shuffle never depends on arrival order.  With a partial round (closed
at its deadline with m < n rows) the m rows present are shuffled.

q after bucketing: q (each row is in one bucket, so at most q buckets hold a Byzantine
row); the rule is checked with (ceil(n/s), q).  Means are accumulated in float64; a
bucket holding a NaN or an infinity is non-finite, for the rule to treat as such.
``last_info``: ``{"permutation": pi}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from common.conf.settings import setting
from common.learn.rules.base import OptionSettings, RuleError, as_int
from common.learn.rules.pre.base import PreAggregator, RoundContext, register_pre
from common.learn.seeding import derive_rng

if TYPE_CHECKING:
    import torch

STREAM = "bucketing"


@register_pre
class Bucketing(PreAggregator):
    """Means of buckets of s rows after a seeded shuffle."""

    name = "bucketing"
    summary = ("shuffle (seeded per round and shard), then average buckets of s rows "
               "(`--bucket-size`, default 2): the rule sees ceil(n/s) rows, q stays q")
    needs = "1 <= s <= n"
    options = ("s",)
    s: int

    @dataclass(frozen=True)
    class Settings(OptionSettings):
        s: int = setting(2, "Bucketing (--pre bucketing): rows averaged per bucket s.",
                         flag="--bucket-size", minimum=1)

    @classmethod
    def check(cls, n: int, q: int, **options: Any) -> dict[str, Any]:
        options = super().check(n, q, **options)
        s = as_int(options["s"], "bucketing option s")
        if not 1 <= s <= n:
            raise RuleError(f"bucketing needs 1 <= s <= n, got s={s}, n={n}")
        return {"s": s}

    @classmethod
    def output_rows(cls, n: int, **options: Any) -> int:
        return -(-n // options["s"])

    def apply(self, G: torch.Tensor, context: RoundContext) -> np.ndarray:
        pi = derive_rng(context.seed, STREAM, context.round, context.shard).permutation(self.n)
        self.last_info = {"permutation": pi.tolist()}
        groups = [pi[b:b + self.s] for b in range(0, self.n, self.s)]
        from common.learn.rules.kernels import reductions

        return reductions.group_means(G.numpy(), groups)
