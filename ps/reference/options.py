"""The settings of ``ps-simulate`` beyond the run's own."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from common.conf.settings import SIMULATE, setting


@dataclass(frozen=True)
class ReplayOptions:
    """Reproduce a recorded run: the workers each shard aggregated in each round."""

    replay: Path | None = setting(
        None, "Output directory of a cluster run (ps-cluster --out-dir, or the servers' "
        "--out-dir): aggregate, per shard and round, exactly the workers that run did "
        "(rounds closed at their deadline without some).", roles=(SIMULATE,))
