"""Which workers each shard aggregated in each round of a recorded run.

A round closed at its deadline (``--round-timeout``) aggregates only the pushes that
were in; each server writes the ids it aggregated in its metrics line
(``server-<s>.jsonl``: ``"workers"``). The reference engine replays that participation
to reproduce a run with crashed or slow workers bit for bit. A server that resumed from
a checkpoint wrote some rounds twice: the last line of a round is the one whose result
the run kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from common.errors import ConfigError
from common.run.metrics import read_jsonl


@dataclass
class Participation:
    """(shard, round) -> the worker ids aggregated, for the rounds that missed some."""

    partial: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)

    def workers(self, shard: int, round_: int, num_workers: int) -> tuple[int, ...]:
        """The ids shard ``shard`` aggregated in round ``round_`` (all n if not recorded)."""
        return self.partial.get((shard, round_), tuple(range(num_workers)))

    @property
    def rounds_closed_short(self) -> int:
        """Shard rounds that were aggregated without all n workers."""
        return len(self.partial)


def read_participation(run_dir: Path, num_shards: int, num_workers: int,
                       rounds: int) -> Participation:
    """The participation recorded in ``run_dir``'s server metrics; ``ConfigError`` if a
    shard's file is missing or does not cover every round."""
    found = Participation()
    for shard in range(num_shards):
        path = run_dir / f"server-{shard}.jsonl"
        lines = read_jsonl(path)
        if not lines:
            raise ConfigError(f"no server metrics at {path}: nothing to replay")
        last: dict[int, list[int]] = {}
        for line in lines:
            last[int(line["round"])] = line.get("workers", list(range(num_workers)))
        missing = [t for t in range(rounds) if t not in last]
        if missing:
            raise ConfigError(f"{path} records no aggregation for rounds {missing[:5]}"
                              f"{' ...' if len(missing) > 5 else ''}")
        for t, ids in last.items():
            if len(ids) < num_workers:
                found.partial[(shard, t)] = tuple(sorted(int(i) for i in ids))
    return found
