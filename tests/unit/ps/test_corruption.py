"""What the man-in-the-middle does to one shard's traffic (``ps/proxy/corruption.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from common.net.sharding import shard_ranges
from common.run.config import AttackConfig, RunConfig
from ps.proxy.corruption import ShardCorruptor

CFG = RunConfig(dataset="synthetic", num_workers=6, num_shards=3, rule="marmed", q=1,
                seed=11).validate()
D = 3000
PAPER_MASK = np.uint32((1 << 21) | (1 << 29) | (1 << 30) | (1 << 31))


def _corruptors(**attack) -> list[ShardCorruptor]:
    a = AttackConfig.build(**attack).validate(CFG)
    return [ShardCorruptor(CFG, a, s, lo, hi) for s, (lo, hi) in enumerate(shard_ranges(D, 3))]


def _grads(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((6, D)).astype(np.float32)


def test_gambler_is_deterministic_and_independent_of_arrival_order() -> None:
    c = _corruptors(proxy_attack="gambler", gambler_p=0.01)[1]
    g = _grads()[:, c.start:c.stop]
    forward = [c.corrupt_push(4, i, g[i]) for i in range(6)]
    backward = [c.corrupt_push(4, i, g[i]) for i in reversed(range(6))][::-1]
    for (a, na), (b, nb) in zip(forward, backward, strict=True):
        np.testing.assert_array_equal(a, b)
        assert na == nb
    changed = sum(n for _, n in forward)
    assert 0 < changed < g.size * 0.05
    for i, (values, n) in enumerate(forward):
        hit = values != g[i]
        assert hit.sum() == n
        np.testing.assert_array_equal(values[hit], (g[i][hit] * np.float32(-1e20)))
    other_round = c.corrupt_push(5, 0, g[0])[0]
    assert not np.array_equal(other_round != g[0], forward[0][0] != g[0])


def test_bitflip_hits_exactly_one_worker_per_coordinate_across_all_shards() -> None:
    k = 1500  # spans shards 0 and 1 (shards are [0,1000), [1000,2000), [2000,3000))
    grads = _grads()
    hits = np.zeros((6, D), dtype=bool)
    total = 0
    for c in _corruptors(proxy_attack="bitflip", bitflip_coords=k):
        for i in range(6):
            values, n = c.corrupt_push(2, i, grads[i, c.start:c.stop])
            flipped = values.view(np.uint32) ^ grads[i, c.start:c.stop].view(np.uint32)
            changed = flipped != 0
            assert (flipped[changed] == PAPER_MASK).all()
            hits[i, c.start:c.stop] = changed
            total += n
    assert (hits[:, :k].sum(axis=0) == 1).all()
    assert not hits[:, k:].any()
    assert total == k


def test_gaussian_replaces_only_the_victims() -> None:
    c = _corruptors(proxy_attack="gaussian", proxy_victims=(2,), gaussian_sd=200.0)[0]
    g = _grads()[:, c.start:c.stop]
    same, n = c.corrupt_push(0, 1, g[1])
    assert n == 0 and np.array_equal(same, g[1])
    forged, n = c.corrupt_push(0, 2, g[2])
    assert n == g.shape[1] and 150 < forged.std() < 250


def test_omniscient_sends_minus_scale_times_the_sum_of_the_correct_pushes() -> None:
    c = _corruptors(proxy_attack="omniscient", proxy_victims=(0, 3), omniscient_scale=10.0)[2]
    assert c.whole_round
    g = _grads()[:, c.start:c.stop]
    out, n = c.corrupt_round(1, list(g))
    expected = -10.0 * g[[1, 2, 4, 5]].sum(axis=0)
    np.testing.assert_allclose(out[0], expected, rtol=1e-6)
    np.testing.assert_array_equal(out[0], out[3])
    for i in (1, 2, 4, 5):
        np.testing.assert_array_equal(out[i], g[i])
    assert n == 2 * g.shape[1]


@pytest.mark.parametrize("worker", [-1, 0])
def test_params_are_corrupted_only_when_asked_and_never_for_the_evaluator(worker: int) -> None:
    values = np.ones(1000, dtype=np.float32)
    off = _corruptors(proxy_attack="gambler", gambler_p=0.5)[0]
    assert off.corrupt_params(0, worker, values)[1] == 0
    on = _corruptors(proxy_attack="gambler", gambler_p=0.5, corrupt_params=True)[0]
    changed = on.corrupt_params(0, worker, values)[1]
    assert (changed == 0) if worker < 0 else (changed > 300)
