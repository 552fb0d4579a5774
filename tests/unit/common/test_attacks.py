"""Unit tests of common/learn/attacks/: exact corruption semantics, determinism, input checks,
the registry and the attack classes."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pytest

from common.errors import ConfigError
from common.learn.attacks import ATTACKS, Site, attack_class, attack_names
from common.learn.attacks.alie import alie
from common.learn.attacks.bitflip import (
    BITFLIP_CODE_BITS,
    BITFLIP_CODE_COORDS,
    BITFLIP_PAPER_BITS,
    BITFLIP_PAPER_COORDS,
    bitflip,
    bitflip_victims,
    flip_bits,
)
from common.learn.attacks.gambler import gambler
from common.learn.attacks.gaussian import gaussian
from common.learn.attacks.ipm import ipm
from common.learn.attacks.omniscient import omniscient
from common.learn.attacks.signflip import signflip
from common.learn.seeding import derive_rng

VECTOR_ATTACKS = {"gaussian": gaussian, "omniscient": omniscient, "signflip": signflip,
                  "alie": alie, "ipm": ipm}


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def values(d: int = 10_000, seed: int = 1) -> np.ndarray:
    return rng(seed).standard_normal(d, dtype=np.float32)


def honest(h: int = 14, d: int = 50, seed: int = 2) -> np.ndarray:
    return rng(seed).standard_normal((h, d), dtype=np.float32)


# --------------------------------------------------------------------------- gambler


def test_gambler_corrupts_exactly_the_masked_values() -> None:
    v = values()
    before = v.copy()
    out, count = gambler(v, rng(7), p=0.01, scale=-1e20)
    mask = rng(7).random(v.size) < 0.01
    assert count == mask.sum() > 0
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out[mask], v[mask] * np.float32(-1e20))
    np.testing.assert_array_equal(out[~mask], v[~mask])
    np.testing.assert_array_equal(v, before)  # input untouched


def test_gambler_is_deterministic_per_seed() -> None:
    v = values()
    a, _ = gambler(v, rng(3), p=0.05)
    b, _ = gambler(v, rng(3), p=0.05)
    c, _ = gambler(v, rng(4), p=0.05)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_gambler_default_p_is_the_papers() -> None:
    out, count = gambler(values(200_000), rng(5))
    assert 60 < count < 140  # 0.05 % of 200k = 100 expected
    assert np.count_nonzero(out != values(200_000)) == count


def test_gambler_p_zero_and_one() -> None:
    v = values(1000)
    out, count = gambler(v, rng(0), p=0.0)
    assert count == 0
    np.testing.assert_array_equal(out, v)
    out, count = gambler(v, rng(0), p=1.0, scale=2.0)
    assert count == v.size
    np.testing.assert_array_equal(out, v * np.float32(2.0))


def test_gambler_consumes_a_fixed_amount_of_randomness() -> None:
    g1, g2 = rng(9), rng(9)
    gambler(values(500), g1, p=0.0)
    gambler(values(500), g2, p=0.9)
    assert g1.random() == g2.random()


def test_gambler_overflow_becomes_infinite() -> None:
    v = np.array([1e19, -1e19, 1.0], dtype=np.float32)
    out, _ = gambler(v, rng(0), p=1.0)
    assert out[0] == -np.inf and out[1] == np.inf and out[2] == np.float32(-1e20)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"p": -0.1}, r"p must be in \[0, 1\]"),
        ({"p": 1.5}, r"p must be in \[0, 1\]"),
        ({"p": float("nan")}, r"p must be in \[0, 1\]"),
        ({"scale": 1e40}, "representable in float32"),
    ],
)
def test_gambler_rejects_bad_parameters(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        gambler(values(10), rng(0), **kwargs)


@pytest.mark.parametrize("bad", [np.zeros(4, np.float64), np.zeros((2, 2), np.float32), [1.0, 2.0]])
def test_value_attacks_want_1d_float32(bad: object) -> None:
    with pytest.raises(ValueError, match="1-D float32"):
        gambler(bad, rng(0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="1-D float32"):
        flip_bits(bad, np.array([0]))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- bit-flip


def test_bitflip_constants() -> None:
    assert BITFLIP_PAPER_BITS == (21, 29, 30, 31) and BITFLIP_PAPER_COORDS == 1000
    assert BITFLIP_CODE_BITS == (22, 29, 30, 31) and BITFLIP_CODE_COORDS == 500


def test_flip_bits_flips_exactly_the_given_bits() -> None:
    v = values(100)
    before = v.copy()
    coords = np.array([0, 5, 99])
    out, count = flip_bits(v, coords, bits=(0, 3, 31))
    assert count == 3
    xor = out.view(np.uint32) ^ v.view(np.uint32)
    expected = np.zeros(100, np.uint32)
    expected[coords] = (1 << 0) | (1 << 3) | (1 << 31)
    np.testing.assert_array_equal(xor, expected)
    np.testing.assert_array_equal(v, before)


def test_flip_bits_default_bits_are_the_papers() -> None:
    v = values(20)
    out, _ = flip_bits(v, np.array([4]))
    xor = out.view(np.uint32)[4] ^ v.view(np.uint32)[4]
    assert xor == (1 << 21) | (1 << 29) | (1 << 30) | (1 << 31)
    # sign flipped; exponent bits 29, 30 flipped: 1.0 (0x3f800000) becomes a huge negative
    one, _ = flip_bits(np.array([1.0], np.float32), np.array([0]))
    assert one.view(np.uint32)[0] == 0x3F800000 ^ 0xE0200000
    assert one[0] < -1e18


def test_flip_bits_with_no_coords_is_identity() -> None:
    v = values(10)
    out, count = flip_bits(v, np.array([], dtype=np.int64))
    assert count == 0
    np.testing.assert_array_equal(out, v)


@pytest.mark.parametrize(
    ("coords", "bits", "message"),
    [
        (np.array([0]), (32,), r"bits must be ints in 0\.\.31"),
        (np.array([0]), (-1,), r"bits must be ints in 0\.\.31"),
        (np.array([0]), (), "at least one bit"),
        (np.array([0]), (3, 3), "distinct"),
        (np.array([10]), (1,), r"coords must lie in \[0, 10\)"),
        (np.array([-1]), (1,), r"coords must lie in \[0, 10\)"),
        (np.array([2, 2]), (1,), "coords must be distinct"),
        (np.array([0.5]), (1,), "integer"),
    ],
)
def test_flip_bits_rejects_bad_parameters(coords: np.ndarray, bits: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        flip_bits(values(10), coords, bits)


def test_bitflip_victims_in_range_uniform_and_deterministic() -> None:
    a = bitflip_victims(20, 10_000, rng(1))
    assert a.dtype == np.int64 and a.shape == (10_000,)
    assert a.min() >= 0 and a.max() <= 19
    assert set(np.unique(a)) == set(range(20))
    np.testing.assert_array_equal(a, bitflip_victims(20, 10_000, rng(1)))
    assert not np.array_equal(a, bitflip_victims(20, 10_000, rng(2)))
    with pytest.raises(ValueError, match="n >= 1"):
        bitflip_victims(0, 5, rng(0))
    with pytest.raises(ValueError, match="num_coords must be >= 0"):
        bitflip_victims(3, -1, rng(0))


def test_bitflip_hits_each_coordinate_in_exactly_one_worker_across_shards() -> None:
    n, d, num_coords = 5, 300, 120
    grads = rng(3).standard_normal((n, d), dtype=np.float32)
    shards = [(0, 50), (50, 200), (200, 300)]
    hits = np.zeros((n, d), dtype=bool)
    total = 0
    for worker in range(n):
        for start, stop in shards:
            out, count = bitflip(
                grads[worker, start:stop],
                rng(11),
                worker=worker,
                n=n,
                offset=start,
                num_coords=num_coords,
            )
            hits[worker, start:stop] = out.view(np.uint32) != grads[worker, start:stop].view(
                np.uint32
            )
            total += count
    assert total == num_coords
    np.testing.assert_array_equal(hits[:, :num_coords].sum(axis=0), np.ones(num_coords))
    assert not hits[:, num_coords:].any()
    victims = bitflip_victims(n, num_coords, rng(11))
    np.testing.assert_array_equal(hits[:, :num_coords].argmax(axis=0), victims)


def test_bitflip_rejects_bad_worker() -> None:
    with pytest.raises(ValueError, match=r"worker must be in \[0, 4\)"):
        bitflip(values(10), rng(0), worker=4, n=4)


# --------------------------------------------------------------------------- vector level


def test_gaussian_shape_sd_and_determinism() -> None:
    h = honest()
    before = h.copy()
    out = gaussian(h, 6, rng(5), sd=200.0)
    assert out.shape == (6, 50) and out.dtype == np.float32
    big = gaussian(honest(d=20_000), 6, rng(5))
    assert 190 < big.std() < 210 and abs(big.mean()) < 5
    np.testing.assert_array_equal(out, gaussian(h, 6, rng(5)))
    assert not np.array_equal(out, gaussian(h, 6, rng(6)))
    np.testing.assert_array_equal(h, before)
    assert not gaussian(h, 2, rng(0), sd=0.0).any()


def test_omniscient_is_minus_scale_times_sum() -> None:
    h = honest(h=5, d=40)
    out = omniscient(h, 3, rng(0), scale=1e20)
    expected = h.sum(axis=0) * np.float32(-1e20)
    assert out.shape == (3, 40) and out.dtype == np.float32
    for row in out:
        np.testing.assert_array_equal(row, expected)
    small = omniscient(h, 1, rng(0), scale=2.0)
    np.testing.assert_allclose(small[0], -2.0 * h.astype(np.float64).sum(axis=0), rtol=1e-5)


def test_omniscient_may_overflow_to_infinity() -> None:
    h = np.full((2, 3), 1e19, dtype=np.float32)
    assert np.all(omniscient(h, 1, rng(0)) == -np.inf)


def test_signflip_is_minus_scale_times_mean() -> None:
    h = honest()
    out = signflip(h, 4, rng(0), scale=3.0)
    assert out.shape == (4, 50) and out.dtype == np.float32
    np.testing.assert_allclose(
        out[1], -3.0 * h.astype(np.float64).mean(axis=0), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_array_equal(out[0], out[3])


def test_ipm_is_minus_epsilon_times_mean() -> None:
    h = honest()
    out = ipm(h, 2, rng(0))  # default epsilon 0.1
    np.testing.assert_allclose(
        out[0], -0.1 * h.astype(np.float64).mean(axis=0), rtol=1e-5, atol=1e-7
    )
    np.testing.assert_allclose(ipm(h, 1, rng(0), epsilon=0.5)[0], 5 * out[0], rtol=1e-5)


def test_alie_formula_and_default_z() -> None:
    h = honest()
    n, f = 20, 6
    s = (n // 2 + 1) - f  # floor(n/2 + 1) - f = 5
    z = NormalDist().inv_cdf((n - s) / n)
    assert z == pytest.approx(0.6744897501960817)
    expected = h.astype(np.float64).mean(axis=0) - z * h.astype(np.float64).std(axis=0)
    out = alie(h, f, rng(0))  # n defaults to 14 honest + 6 Byzantine = 20
    assert out.shape == (f, 50) and out.dtype == np.float32
    np.testing.assert_allclose(out[0], expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(alie(h, f, rng(0), n=20), out)
    explicit = alie(h, 1, rng(0), z=1.5)
    np.testing.assert_allclose(
        explicit[0],
        h.mean(axis=0, dtype=np.float64) - 1.5 * h.std(axis=0, dtype=np.float64),
        rtol=1e-6,
        atol=1e-6,
    )


def test_alie_rejects_undefined_z() -> None:
    with pytest.raises(ValueError, match="ALIE's z is undefined"):
        alie(honest(h=2), 5, rng(0))  # n=7, s = 4 - 5 < 1
    with pytest.raises(ValueError, match="z must be finite"):
        alie(honest(), 1, rng(0), z=float("inf"))


@pytest.mark.parametrize("name", sorted(VECTOR_ATTACKS))
def test_vector_attacks_validate_inputs(name: str) -> None:
    attack = VECTOR_ATTACKS[name]
    with pytest.raises(ValueError, match="2-D"):
        attack(honest().astype(np.float64), 2, rng(0))
    with pytest.raises(ValueError, match="2-D"):
        attack(honest()[0], 2, rng(0))
    with pytest.raises(ValueError, match="num_byzantine must be >= 1"):
        attack(honest(), 0, rng(0))
    with pytest.raises(ValueError, match="at least one gradient row"):
        attack(np.zeros((0, 5), np.float32), 1, rng(0))


def test_gaussian_rejects_negative_sd() -> None:
    with pytest.raises(ValueError, match="sd must be finite and >= 0"):
        gaussian(honest(), 1, rng(0), sd=-1.0)


@pytest.mark.parametrize("name", sorted(VECTOR_ATTACKS))
def test_vector_attacks_do_not_modify_inputs(name: str) -> None:
    h = honest()
    before = h.copy()
    out = VECTOR_ATTACKS[name](h, 3, rng(0))
    assert out.shape == (3, h.shape[1]) and out.dtype == np.float32
    np.testing.assert_array_equal(h, before)


# --------------------------------------------------------------------------- registries


# they train, read the whole rule, or keep a memory (mimic-adaptive: test_mimic_adaptive)
WORKER_ONLY = {"labelflip", "alie-opt", "ipm-opt", "mimic-adaptive"}
NEWER = {"mimic", "inf", "minmax", "minsum", *WORKER_ONLY}  # tested in test_attacks_modern


def test_registry_lists_each_attack_where_it_can_run() -> None:
    assert set(ATTACKS) == {"gambler", "bitflip", *VECTOR_ATTACKS, *NEWER}
    assert set(attack_names("proxy")) == {"none", *ATTACKS} - WORKER_ONLY
    assert set(attack_names("worker")) == {"none", *VECTOR_ATTACKS, *NEWER}
    with pytest.raises(ConfigError, match="unknown attack 'nope'; valid: "):
        attack_class("nope")


@pytest.mark.parametrize("name", sorted(VECTOR_ATTACKS))
def test_vector_attack_classes_forge_with_their_function(name: str) -> None:
    h = honest()
    forged = attack_class(name)().forge_at(h, 3, 20, 7, "worker-attack", 4)
    expected = VECTOR_ATTACKS[name](h, 3, derive_rng(7, "worker-attack", 4),
                                    **({"n": 20} if name == "alie" else {}))
    np.testing.assert_array_equal(forged, expected)


def test_value_attack_classes_draw_per_site() -> None:
    v = values(5000)
    site = Site(seed=3, round=2, worker=1, shard=0, start=0, num_workers=4, what="push")
    out, count = attack_class("gambler")(p=0.01).corrupt(v, site)
    expected = gambler(v, derive_rng(3, "proxy-gambler-push", 2, 1, 0), p=0.01)
    np.testing.assert_array_equal(out, expected[0])
    assert count == expected[1] > 0
    flipped, hits = attack_class("bitflip")(coords=1000).corrupt(v, site)
    changed = np.count_nonzero(flipped.view(np.uint32) != v.view(np.uint32))
    assert 0 < hits < 1000 and changed == hits


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("gambler", {"p": 1.5}, "--gambler-p must be in"),
        ("gambler", {"scale": 1e40}, "representable in float32"),
        ("bitflip", {"bits": (3, 3)}, "distinct"),
        ("bitflip", {"bits": (32,)}, "--bitflip-bits must be in"),
        ("gaussian", {"sd": -1.0}, "--gaussian-sd must be >= 0"),
        ("alie", {}, "ALIE's z is undefined"),
    ],
)
def test_attack_parameters_are_checked_with_their_flag(name: str, params: dict,
                                                       message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        attack_class(name)(**params).check(num_workers=7, num_byzantine=5)


def test_the_package_docstring_names_every_attack_where_it_runs() -> None:
    """``common.learn.attacks``' docstring lists each registered attack once, among those a
    proxy runs or among those only workers run, as its ``sites`` say."""
    import re

    import common.learn.attacks
    from common.conf.settings import PROXY
    from common.learn.attacks import ATTACKS

    text = " ".join(common.learn.attacks.__doc__.split())
    workers_only = text[text.index("by Byzantine workers only"):]
    for name, cls in ATTACKS.items():
        assert len(re.findall(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text)) == 1, name
        assert (re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", workers_only) is None) \
            == (PROXY in cls.sites), name
