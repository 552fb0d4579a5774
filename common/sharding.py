"""The one place that knows how the model vector is split across server nodes."""

from __future__ import annotations


def shard_ranges(d: int, num_shards: int) -> list[tuple[int, int]]:
    """Split ``[0, d)`` into ``num_shards`` contiguous, near-equal ``(start, stop)`` ranges.

    The first ``d % num_shards`` shards get one extra coordinate, so sizes differ by at
    most one and the ranges cover ``[0, d)`` exactly, in order.
    """
    if d < 1:
        raise ValueError(f"the model must have at least one parameter, got d={d}")
    if num_shards < 1:
        raise ValueError(f"need at least one shard, got S={num_shards}")
    if num_shards > d:
        raise ValueError(f"cannot split d={d} parameters into S={num_shards} non-empty shards")
    base, extra = divmod(d, num_shards)
    ranges = []
    start = 0
    for s in range(num_shards):
        stop = start + base + (1 if s < extra else 0)
        ranges.append((start, stop))
        start = stop
    return ranges
