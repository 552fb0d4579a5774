"""Unit tests of the newer attacks and of worker momentum, each against its paper on small
hand-made inputs: Mimic (Karimireddy, He, Jaggi, ICLR 2022), Inf (ByzFL), label flipping
(Allen-Zhu et al., ICLR 2021), Min-Max and Min-Sum (Shejwalkar, Houmansadr, NDSS 2021),
ByzFL's line search and the optimised ALIE (Baruch et al., NeurIPS 2019) and IPM (Xie,
Koyejo, Gupta, UAI 2019) built on it, the :class:`Aim` they search against, worker
momentum (``worker/byzantine.py``) and the reference engine's momentum paths."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import pytest
import torch

import common.learn.attacks.minmax as minmax_module
from common.conf.settings import PROXY, WORKER
from common.errors import ConfigError
from common.learn.attacks import attack_names
from common.learn.attacks.alie import alie
from common.learn.attacks.alie_opt import AlieOpt, alie_opt
from common.learn.attacks.base import Aim, line_maximize
from common.learn.attacks.inf import Inf, inf
from common.learn.attacks.ipm import ipm
from common.learn.attacks.ipm_opt import IpmOpt, ipm_opt
from common.learn.attacks.labelflip import LabelFlip, flip_labels
from common.learn.attacks.mimic import Mimic, mimic
from common.learn.attacks.minmax import largest_gamma, minmax, perturbation
from common.learn.attacks.minsum import minsum
from common.learn.data import load_dataset
from common.net.sharding import shard_ranges
from common.run.config import AttackConfig, RunConfig
from common.run.model_init import initial_parameters
from ps.reference import engine
from ps.reference.engine import simulate
from server.group import ShardGroup
from worker import step as worker_step
from worker.byzantine import ByzantineState, ServerAggregation, aim, byzantine_gradient
from worker.trainer import GradientComputer, Momentum

F32 = np.float32
RNG = np.random.default_rng(0)  # never read: the attacks tested here draw nothing

# Four honest vectors: mean (2, 2, -3, 0); coordinate-wise sums of squared deviations
# 2, 8, 14, 10, so the std (ddof=1) is sqrt((2, 8, 14, 10) / 3).
HAND = np.array([[1, 2, -3, 1],
                 [3, 0, -1, -1],
                 [2, 4, -2, 2],
                 [2, 2, -6, -2]], dtype=F32)
HAND_MEAN = np.array([2.0, 2.0, -3.0, 0.0])
HAND_PERTURBATIONS = {
    "unit": HAND_MEAN / math.sqrt(17.0),
    "std": np.sqrt(np.array([2.0, 8.0, 14.0, 10.0]) / 3.0),
    "sign": np.array([1.0, 1.0, -1.0, 0.0]),
}


def honest_rows(h: int = 5, d: int = 12, seed: int = 1) -> np.ndarray:
    gen = np.random.default_rng(seed)
    return (gen.standard_normal((h, d)) + gen.standard_normal(d)).astype(F32)


# --------------------------------------------------------------------------- mimic, inf


def test_mimic_copies_the_indexed_honest_vector() -> None:
    honest = honest_rows()
    before = honest.copy()
    for index in (0, 3):
        out = mimic(honest, 3, RNG, index=index)
        assert out.shape == (3, 12) and out.dtype == F32
        for row in out:
            np.testing.assert_array_equal(row, honest[index])
    np.testing.assert_array_equal(honest, before)
    np.testing.assert_array_equal(Mimic(index=2).forge(honest, 2, RNG, 7),
                                  np.stack([honest[2], honest[2]]))


@pytest.mark.parametrize("index", [5, -1])
def test_mimic_index_outside_the_honest_rows_is_refused(index: int) -> None:
    with pytest.raises(ValueError, match="mimic index"):
        mimic(honest_rows(h=5), 2, RNG, index=index)


def test_mimic_index_must_name_a_correct_worker() -> None:
    cfg = RunConfig(dataset="synthetic", num_workers=7, rule="marmed").validate()
    ok = AttackConfig.build(worker_attack="mimic", byzantine_workers=(1, 4), mimic_index=4)
    ok.validate(cfg)  # 5 correct workers: indices 0..4
    bad = AttackConfig.build(worker_attack="mimic", byzantine_workers=(1, 4), mimic_index=5)
    with pytest.raises(ConfigError, match="--mimic-index"):
        bad.validate(cfg)
    with pytest.raises(ConfigError, match="--mimic-index"):
        Mimic(index=5).check(7, 2)


def test_inf_is_all_plus_infinity_of_the_right_shape() -> None:
    out = inf(honest_rows(h=4, d=9), 3, RNG)
    assert out.shape == (3, 9) and out.dtype == F32
    assert np.all(np.isposinf(out))
    assert not Inf.reads_honest
    with pytest.raises(ValueError, match="num_byzantine"):
        inf(honest_rows(), 0, RNG)


def test_worker_only_attacks_are_not_offered_to_a_proxy() -> None:
    for name in ("labelflip", "alie-opt", "ipm-opt"):
        assert name in attack_names(WORKER) and name not in attack_names(PROXY)
    for name in ("mimic", "inf", "minmax", "minsum"):
        assert name in attack_names(WORKER) and name in attack_names(PROXY)


# --------------------------------------------------------------------------- label flipping


def test_flip_labels_is_num_classes_minus_one_minus_y() -> None:
    y = torch.arange(10)
    assert flip_labels(y, 10).tolist() == [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]
    np.testing.assert_array_equal(flip_labels(np.array([0, 1, 1, 0]), 2), [1, 0, 0, 1])
    assert LabelFlip().relabel(torch.tensor([0, 9, 4]), 10).tolist() == [9, 0, 5]
    for classes in (1, 0):
        with pytest.raises(ValueError, match="at least 2 classes"):
            flip_labels(y, classes)


def _flipped_computers(cfg: RunConfig) -> tuple[GradientComputer, GradientComputer]:
    """(the run's trainer, a trainer of the same data whose labels are 9 - y)."""
    data = load_dataset(cfg.dataset, None, seed=cfg.seed)
    flipped = dataclasses.replace(data, train_y=(data.num_classes - 1) - data.train_y)
    return GradientComputer(cfg, data), GradientComputer(cfg, flipped)


def test_labelflip_worker_pushes_the_gradient_of_the_flipped_labels() -> None:
    cfg = RunConfig(dataset="synthetic", num_workers=4, num_shards=2, rule="marmed").validate()
    attack = AttackConfig.build(worker_attack="labelflip", byzantine_workers=(2,)).validate(cfg)
    computer, by_hand = _flipped_computers(cfg)
    x = initial_parameters(cfg)
    pushed = byzantine_gradient(cfg, attack, computer, x, 3, 2)
    np.testing.assert_array_equal(pushed, by_hand.gradient(x, 3, 2)[0])
    assert not np.array_equal(pushed, computer.gradient(x, 3, 2)[0])


def test_labelflip_worker_applies_its_own_momentum() -> None:
    cfg = RunConfig(dataset="synthetic", num_workers=4, num_shards=2, rule="marmed",
                    worker_momentum=0.9).validate()
    attack = AttackConfig.build(worker_attack="labelflip", byzantine_workers=(2,)).validate(cfg)
    computer, by_hand = _flipped_computers(cfg)
    state = ByzantineState.start(cfg, attack)
    x0 = initial_parameters(cfg)
    x1 = x0 * F32(0.5)
    m = np.zeros_like(x0)
    for t, x in enumerate((x0, x1)):
        m = F32(0.9) * m + F32(1.0 - 0.9) * by_hand.gradient(x, t, 2)[0]
        np.testing.assert_array_equal(byzantine_gradient(cfg, attack, computer, x, t, 2,
                                                         state=state), m)


# --------------------------------------------------------------------------- min-max, min-sum


def test_perturbations_are_the_papers() -> None:
    for kind, expected in HAND_PERTURBATIONS.items():
        np.testing.assert_allclose(perturbation(HAND, kind), expected, rtol=1e-12)
    np.testing.assert_array_equal(perturbation(HAND[:1], "std"), np.zeros(4))
    np.testing.assert_array_equal(perturbation(HAND - HAND.mean(axis=0), "unit"), np.zeros(4))
    with pytest.raises(ValueError, match="perturbation must be one of"):
        perturbation(HAND, "gauss")


def minmax_threshold(honest: np.ndarray, p: np.ndarray) -> float:
    """The largest gamma with ``max_i ||mean - gamma p - g_i||^2 <= max_ij ||g_i - g_j||^2``:
    each ``||a_i - gamma p||^2 = R`` (a_i = mean - g_i) is a quadratic in gamma whose
    larger root bounds it."""
    data = honest.astype(np.float64)
    bound = max(float(((gi - gj) ** 2).sum()) for gi in data for gj in data)
    pp = float(p @ p)
    roots = []
    for a in data.mean(axis=0) - data:
        ap = float(a @ p)
        roots.append((ap + math.sqrt(ap * ap - pp * (float(a @ a) - bound))) / pp)
    return min(roots)


def minsum_threshold(honest: np.ndarray, p: np.ndarray) -> float:
    """The largest gamma with ``sum_i ||m - g_i||^2 <= min_i sum_j ||g_i - g_j||^2``: the
    deviations from the mean sum to zero, so the left side is ``S0 + h gamma^2 ||p||^2``."""
    data = honest.astype(np.float64)
    h = data.shape[0]
    s0 = float(((data - data.mean(axis=0)) ** 2).sum())
    bound = min(float(((data - gi) ** 2).sum()) for gi in data)
    return math.sqrt((bound - s0) / (h * float(p @ p)))


def minmax_fits(honest: np.ndarray, vector: np.ndarray) -> bool:
    data = honest.astype(np.float64)
    return max(float(((vector - gi) ** 2).sum()) for gi in data) <= max(
        float(((gi - gj) ** 2).sum()) for gi in data for gj in data)


def minsum_fits(honest: np.ndarray, vector: np.ndarray) -> bool:
    data = honest.astype(np.float64)
    return sum(float(((vector - gi) ** 2).sum()) for gi in data) <= min(
        float(((data - gi) ** 2).sum()) for gi in data)


SEARCHES = {"minmax": (minmax, minmax_threshold, minmax_fits),
            "minsum": (minsum, minsum_threshold, minsum_fits)}


@pytest.mark.parametrize("kind", ["unit", "std", "sign"])
@pytest.mark.parametrize("name", ["minmax", "minsum"])
def test_agr_agnostic_attack_is_mean_minus_the_largest_gamma_times_p(
        name: str, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    attack, threshold, fits = SEARCHES[name]
    found: list[float] = []

    def recording(*args, **kwargs) -> float:
        found.append(largest_gamma(*args, **kwargs))
        return found[-1]

    monkeypatch.setattr(minmax_module, "largest_gamma", recording)
    before = HAND.copy()
    out = attack(HAND, 3, RNG, perturbation=kind)
    np.testing.assert_array_equal(HAND, before)
    assert out.shape == (3, 4) and out.dtype == F32
    assert all(np.array_equal(row, out[0]) for row in out)
    (gamma,) = found
    p = HAND_PERTURBATIONS[kind]
    np.testing.assert_allclose(out[0], HAND_MEAN - gamma * p, rtol=1e-6, atol=1e-6)
    best = threshold(HAND, p)
    assert 0 < best < 20  # inside the search's range (below twice gamma_init)
    assert best - 2e-5 <= gamma <= best  # the search's tolerance: within 2 tau
    assert fits(HAND, HAND_MEAN - gamma * p)
    assert not fits(HAND, HAND_MEAN - (gamma + 1e-3) * p)


@pytest.mark.parametrize("seed", range(5))
def test_agr_agnostic_attacks_stay_within_the_honest_spread(seed: int) -> None:
    gen = np.random.default_rng(seed)
    h, d = int(gen.integers(3, 9)), int(gen.integers(5, 40))
    honest = (gen.standard_normal((h, d)) * gen.uniform(0.1, 3)
              + gen.standard_normal(d)).astype(F32)
    data = honest.astype(np.float64)
    pairwise = np.array([[((gi - gj) ** 2).sum() for gj in data] for gi in data])
    for kind in ("unit", "std", "sign"):
        bad = minmax(honest, 2, RNG, perturbation=kind)[0].astype(np.float64)
        distances = ((data - bad) ** 2).sum(axis=1)
        assert distances.max() <= pairwise.max() * (1 + 1e-5)
        assert not np.allclose(bad, data.mean(axis=0))  # it did move off the mean
        bad = minsum(honest, 2, RNG, perturbation=kind)[0].astype(np.float64)
        distances = ((data - bad) ** 2).sum(axis=1)
        assert distances.sum() <= pairwise.sum(axis=1).min() * (1 + 1e-5)


@pytest.mark.parametrize("threshold", [0.5, math.pi, 7.0, 12.345, 19.9])
@pytest.mark.parametrize("tau", [1e-5, 1e-3])
def test_largest_gamma_finds_a_known_threshold(threshold: float, tau: float) -> None:
    gamma = largest_gamma(lambda g: g <= threshold, 10.0, tau)
    assert threshold - 2 * tau <= gamma <= threshold


def test_largest_gamma_limits() -> None:
    assert largest_gamma(lambda g: False) == 0.0
    assert 20 - 2e-5 <= largest_gamma(lambda g: g <= 25.0) < 20  # never past 2 gamma_init
    assert largest_gamma(lambda g: True, gamma_init=0.0) == 0.0
    for kwargs in ({"gamma_init": -1.0}, {"gamma_init": math.nan}, {"tau": 0.0},
                   {"tau": math.inf}):
        with pytest.raises(ValueError):
            largest_gamma(lambda g: True, **kwargs)


# --------------------------------------------------------------------------- line search


def counted(objective: Callable[[float], float]) -> tuple[Callable[[float], float],
                                                          list[tuple[float, float]]]:
    calls: list[tuple[float, float]] = []

    def wrapped(x: float) -> float:
        y = objective(x)
        calls.append((x, y))
        return y

    return wrapped, calls


OBJECTIVES: dict[str, Callable[[float], float]] = {
    "increasing": lambda x: x,
    "decreasing": lambda x: -x,
    "concave": lambda x: -(x - 3.7) ** 2,
    "constant": lambda x: 1.0,
}


@pytest.mark.parametrize("evals", [1, 2, 3, 7, 16, 40])
@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_line_maximize_evaluates_exactly_evals_times(name: str, evals: int) -> None:
    objective, calls = counted(OBJECTIVES[name])
    line_maximize(objective, evals)
    assert len(calls) == evals


def test_line_maximize_expands_by_doubling_then_contracts() -> None:
    objective, calls = counted(OBJECTIVES["increasing"])
    assert line_maximize(objective, 5) == 15.0
    assert [x for x, _ in calls] == [0.0, 1.0, 3.0, 7.0, 15.0]
    objective, calls = counted(OBJECTIVES["concave"])
    line_maximize(objective, 5)
    assert [x for x, _ in calls][:4] == [0.0, 1.0, 3.0, 7.0]
    assert calls[4][0] == pytest.approx(7.0 - 4.0 * 0.8)  # back by the contracted step


def test_line_maximize_finds_the_top_of_a_concave_function() -> None:
    assert line_maximize(OBJECTIVES["concave"], 30) == pytest.approx(3.7, abs=0.01)
    assert line_maximize(OBJECTIVES["concave"]) == pytest.approx(3.7, abs=0.1)


@pytest.mark.parametrize("seed", range(6))
def test_line_maximize_returns_the_best_point_it_evaluated(seed: int) -> None:
    gen = np.random.default_rng(seed)
    peak, width = gen.uniform(0, 30), gen.uniform(0.5, 10)
    objective, calls = counted(lambda x: -((x - peak) / width) ** 2)
    best = line_maximize(objective, int(gen.integers(1, 25)), start=gen.uniform(0, 5),
                         delta=gen.uniform(0.1, 3), ratio=gen.uniform(0.55, 0.95))
    ys = [y for _, y in calls]
    assert best == calls[ys.index(max(ys))][0]  # the first of the best
    assert all(x >= 0 for x, _ in calls)


def test_line_maximize_ties_keep_the_earlier_point() -> None:
    assert line_maximize(OBJECTIVES["constant"], 16, start=2.5) == 2.5
    assert line_maximize(lambda x: min(x, 1.0), 16) == 1.0  # 3, 7, ... tie with 1


def test_line_maximize_never_picks_nan() -> None:
    assert line_maximize(lambda x: 0.0 if x == 0 else math.nan, 8) == 0.0
    objective, calls = counted(lambda x: math.nan if x == 3.0 else x)
    assert line_maximize(objective, 8) != 3.0
    # NaN at the start: any number beats it
    objective, calls = counted(lambda x: math.nan if x == 0 else -(x - 2.0) ** 2)
    best = line_maximize(objective, 8)
    assert best > 0 and not math.isnan(dict(calls)[best])


@pytest.mark.parametrize("kwargs", [
    {"evals": 0}, {"start": -1.0}, {"start": math.nan}, {"start": math.inf},
    {"delta": 0.0}, {"delta": -1.0}, {"delta": math.inf}, {"ratio": 0.5}, {"ratio": 1.0},
    {"ratio": 0.3},
])
def test_line_maximize_checks_its_arguments(kwargs: dict) -> None:
    objective, calls = counted(lambda x: x)
    with pytest.raises(ValueError, match="line search"):
        line_maximize(objective, **kwargs)
    assert not calls


# --------------------------------------------------------------------------- Aim


def test_aim_rows_put_the_forged_vectors_in_the_byzantine_rows() -> None:
    honest = np.arange(10, 15, dtype=F32)[:, None] * np.ones((1, 3), dtype=F32)
    forged = -np.arange(1, 3, dtype=F32)[:, None] * np.ones((1, 3), dtype=F32)
    first = {(1, 4): [10, -1, 11, 12, -2, 13, 14], (0, 6): [-1, 10, 11, 12, 13, 14, -2],
             (4, 1): [10, -2, 11, 12, -1, 13, 14]}  # forged[k] takes row byzantine[k]
    for byzantine, expected in first.items():
        rows = Aim(lambda m: m.mean(axis=0), byzantine).rows(honest, forged)
        assert rows.dtype == F32
        np.testing.assert_array_equal(rows[:, 0], expected)
        assert np.all(rows == rows[:, :1])


@pytest.mark.parametrize("byzantine", [(1,), (1, 4, 5), (1, 7), (1, 1), (-1, 2)])
def test_aim_rows_refuse_rows_that_do_not_fit(byzantine: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="aim has Byzantine rows"):
        Aim(lambda m: m.mean(axis=0), byzantine).rows(honest_rows(h=5), honest_rows(h=2))


def test_aim_distance_is_from_the_honest_mean() -> None:
    honest = honest_rows()
    forged = np.zeros((2, 12), dtype=F32)
    rows_mean = Aim(lambda m: m.mean(axis=0), (0, 1))
    expected = np.linalg.norm((honest.sum(axis=0, dtype=np.float64) / 7)
                              - honest.mean(axis=0, dtype=np.float64))
    assert rows_mean.distance(honest, forged) == pytest.approx(expected, rel=1e-6)


# --------------------------------------------------------------------------- optimised


def recording_aim(aggregate: Callable[[np.ndarray], np.ndarray],
                  byzantine: tuple[int, ...]) -> tuple[Aim, list[np.ndarray]]:
    seen: list[np.ndarray] = []

    def wrapped(rows: np.ndarray) -> np.ndarray:
        seen.append(rows.copy())
        return aggregate(rows)

    return Aim(wrapped, byzantine), seen


def plain_mean(rows: np.ndarray) -> np.ndarray:
    return rows.mean(axis=0, dtype=np.float64).astype(F32)


def coordinate_median(rows: np.ndarray) -> np.ndarray:
    return np.median(rows, axis=0).astype(F32)


def check_best_of_evaluated(honest: np.ndarray, out: np.ndarray,
                            aggregate: Callable[[np.ndarray], np.ndarray],
                            byzantine: tuple[int, ...], seen: list[np.ndarray]) -> None:
    """``out`` is the forged rows of the first evaluation with the largest distance."""
    plain = Aim(aggregate, byzantine)
    rows = list(byzantine)
    distances = [plain.distance(honest, matrix[rows]) for matrix in seen]
    np.testing.assert_array_equal(out, seen[distances.index(max(distances))][rows])


@pytest.mark.parametrize("evals", [1, 5, 9])
def test_alie_opt_against_a_mean_goes_as_far_as_the_search_does(evals: int) -> None:
    honest = honest_rows()
    aim_, seen = recording_aim(plain_mean, (1, 4))
    out = alie_opt(honest, 2, RNG, aim_, evals=evals)
    assert len(seen) == evals
    check_best_of_evaluated(honest, out, plain_mean, (1, 4), seen)
    # under a mean the distance (f/n) z ||std|| grows with z: the search only expands,
    # doubling its step, and ends at z = 2^(evals-1) - 1
    np.testing.assert_array_equal(out, alie(honest, 2, RNG, z=2.0 ** (evals - 1) - 1))


def test_alie_opt_against_a_median_is_still_an_alie_vector() -> None:
    honest = honest_rows(h=5, d=30, seed=4)
    aim_, seen = recording_aim(coordinate_median, (0, 6))
    out = alie_opt(honest, 2, RNG, aim_, evals=16)
    check_best_of_evaluated(honest, out, coordinate_median, (0, 6), seen)
    mean = honest.mean(axis=0, dtype=np.float64)
    std = honest.std(axis=0, dtype=np.float64)
    z = float((mean - out[0]) @ std / (std @ std))
    assert z >= 0
    np.testing.assert_allclose(out[0], mean - z * std, rtol=1e-5, atol=1e-5)
    assert np.array_equal(out[0], out[1])


@pytest.mark.parametrize("evals", [1, 5])
def test_ipm_opt_against_a_mean_goes_as_far_as_the_search_does(evals: int) -> None:
    honest = honest_rows()
    aim_, seen = recording_aim(plain_mean, (2, 3))
    out = ipm_opt(honest, 2, RNG, aim_, evals=evals)
    check_best_of_evaluated(honest, out, plain_mean, (2, 3), seen)
    tau = 2.0 ** (evals - 1) - 1  # the distance f tau ||mean|| / n grows with tau
    np.testing.assert_array_equal(out, ipm(honest, 2, RNG, epsilon=tau - 1.0))


def test_ipm_opt_against_a_median_is_still_an_ipm_vector() -> None:
    honest = honest_rows(h=5, d=30, seed=5)
    aim_, seen = recording_aim(coordinate_median, (0, 1))
    out = ipm_opt(honest, 2, RNG, aim_)
    check_best_of_evaluated(honest, out, coordinate_median, (0, 1), seen)
    mean = honest.mean(axis=0, dtype=np.float64)
    factor = float(out[0].astype(np.float64) @ mean / (mean @ mean))  # 1 - tau
    assert factor <= 1 + 1e-6
    np.testing.assert_allclose(out[0], factor * mean, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls", [AlieOpt, IpmOpt])
def test_optimised_attacks_need_an_aim(cls: type) -> None:
    attack = cls()
    honest = honest_rows()
    with pytest.raises(ValueError, match="needs an aim"):
        attack.forge_at(honest, 2, 7, 0, "worker-attack", 3)
    with pytest.raises(ValueError, match="needs an aim"):
        attack.forge(honest, 2, RNG, 7)
    aim_ = Aim(plain_mean, (1, 4))
    forged = attack.forge_at(honest, 2, 7, 0, "worker-attack", 3, aim=aim_)
    direct = (alie_opt if cls is AlieOpt else ipm_opt)(honest, 2, RNG, aim_)
    np.testing.assert_array_equal(forged, direct)


# --------------------------------------------------------------------------- momentum


def test_momentum_zero_is_the_gradient_itself() -> None:
    g = honest_rows(h=1)[0]
    momentum = Momentum(0.0)
    assert momentum(g) is g
    assert momentum(g) is g


def test_momentum_is_the_float32_recursion() -> None:
    grads = honest_rows(h=6, d=20, seed=7)
    before = grads.copy()
    momentum = Momentum(0.9)
    m = np.zeros(20, dtype=F32)
    beta, one_minus = F32(0.9), F32(1.0 - 0.9)
    for g in grads:
        expected = np.array([F32(beta * a) + F32(one_minus * b) for a, b in zip(m, g, strict=True)],
                            dtype=F32)
        out = momentum(g)
        assert out.dtype == F32 and out is not g
        np.testing.assert_array_equal(out, expected)
        m = expected
    np.testing.assert_array_equal(grads, before)  # inputs untouched
    exact = np.zeros(20)
    for g in grads.astype(np.float64):
        exact = 0.9 * exact + 0.1 * g
    np.testing.assert_allclose(m, exact, rtol=1e-5, atol=1e-6)


def test_momentum_copy_is_independent() -> None:
    g0, g1, g2 = honest_rows(h=3, d=8)
    half = F32(0.5)
    momentum = Momentum(0.5)
    m0 = momentum(g0)
    np.testing.assert_array_equal(m0, half * g0)
    copy = momentum.copy()
    np.testing.assert_array_equal(momentum(g1), half * m0 + half * g1)
    np.testing.assert_array_equal(copy(g2), half * m0 + half * g2)
    np.testing.assert_array_equal(m0, half * g0)  # neither changed m_0 in place


@pytest.mark.parametrize("beta", [-0.1, 1.0, 1.5, math.nan])
def test_momentum_beta_out_of_range_is_refused(beta: float) -> None:
    with pytest.raises(ValueError, match="momentum beta"):
        Momentum(beta)
    with pytest.raises(ConfigError, match="--worker-momentum"):
        RunConfig(dataset="synthetic", worker_momentum=beta).validate()


def test_byzantine_workers_forge_from_the_honest_momenta() -> None:
    """Mimic copies the correct worker with the smallest id: with momentum, its momentum."""
    cfg = RunConfig(dataset="synthetic", num_workers=4, num_shards=2, rule="marmed",
                    worker_momentum=0.9).validate()
    attack = AttackConfig.build(worker_attack="mimic", byzantine_workers=(0, 2)).validate(cfg)
    computer = GradientComputer(cfg, load_dataset(cfg.dataset, None, seed=cfg.seed))
    state = ByzantineState.start(cfg, attack)
    assert sorted(state.honest) == [1, 3]
    x0 = initial_parameters(cfg)
    m = np.zeros_like(x0)
    for t, x in enumerate((x0, x0 * F32(0.5), x0 * F32(2))):
        m = F32(0.9) * m + F32(1.0 - 0.9) * computer.gradient(x, t, 1)[0]
        np.testing.assert_array_equal(
            byzantine_gradient(cfg, attack, computer, x, t, 2, state=state), m)


# --------------------------------------------------------------------------- server aggregation


@pytest.mark.parametrize("rule,q,rounds", [("trimmed-mean", 1, (0, 3, 4)),
                                           ("centered-clipping", 1, (0,)),
                                           ("geomed", 1, (0, 2))])
def test_server_aggregation_is_what_the_shards_compute(rule: str, q: int,
                                                       rounds: tuple[int, ...]) -> None:
    cfg = RunConfig(dataset="synthetic", num_workers=7, num_shards=3, rule=rule, q=q,
                    pre="bucketing", lr=1.0, rounds=10, seed=5).validate()
    d = 23
    rows = np.random.default_rng(3).standard_normal((7, d)).astype(F32)
    servers = ServerAggregation(cfg, d)
    attack = AttackConfig.build(worker_attack="alie-opt",
                                byzantine_workers=(1, 4)).validate(cfg)
    outs = []
    for t in rounds:
        expected = []
        for s, (a, b) in enumerate(shard_ranges(d, cfg.num_shards)):
            group = ShardGroup(cfg, [s], np.zeros(d, dtype=F32))
            if t:
                group.states[0].restore(t, np.zeros(b - a, dtype=F32))
            for i in range(7):
                group.push(t, i, rows[i, a:b])
            group.step()
            expected.append(-group.states[0].params)  # x = 0 - 1 * Aggr
        expected = np.concatenate(expected)
        out = servers(rows, t)
        assert out.dtype == F32
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_array_equal(aim(cfg, attack, d, t).aggregate(rows), expected)
        assert aim(cfg, attack, d, t).byzantine == (1, 4)
        outs.append(out)
    if rule == "trimmed-mean":  # the bucketing shuffle follows the round
        assert not np.array_equal(outs[1], outs[2])


# --------------------------------------------------------------------------- reference engine


def test_engine_with_worker_momentum_is_deterministic_and_differs() -> None:
    settings = {"dataset": "synthetic", "num_workers": 5, "num_shards": 2, "rounds": 3,
                "rule": "meamed", "q": 1}
    cfg = RunConfig(**settings, worker_momentum=0.9).validate()
    attack = AttackConfig.build(worker_attack="alie", byzantine_workers=(0, 3)).validate(cfg)
    first, second = simulate(cfg, attack), simulate(cfg, attack)
    assert first.digest == second.digest
    np.testing.assert_array_equal(first.params, second.params)
    plain = RunConfig(**settings, worker_momentum=0.0).validate()
    assert simulate(plain, attack).digest != first.digest


def test_engine_pushes_the_momentum_of_each_worker() -> None:
    """One worker, Mean: x_(t+1) = x_t - lr m_t exactly, m_t by the hand recursion."""
    cfg = RunConfig(dataset="synthetic", num_workers=1, num_shards=2, rule="mean", q=0,
                    rounds=3, lr=0.1, worker_momentum=0.9).validate()
    computer = GradientComputer(cfg, load_dataset(cfg.dataset, None, seed=cfg.seed))
    x = initial_parameters(cfg)
    m = np.zeros_like(x)
    for t in range(cfg.rounds):
        m = F32(0.9) * m + F32(1.0 - 0.9) * computer.gradient(x, t, 0)[0]
        x = x - F32(0.1) * m
    np.testing.assert_array_equal(simulate(cfg, AttackConfig().validate(cfg)).params, x)


def test_engine_momentum_when_a_byzantine_workers_view_differs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A gambler proxy corrupts PARAMS per worker: a Byzantine worker forges from the
    honest momenta while it pulled what they pulled, then tracks them from its own views,
    starting from theirs; that must equal a worker tracking them itself from round 0 (what
    a ps-worker process does)."""
    cfg = RunConfig(dataset="synthetic", num_workers=5, num_shards=2, rounds=4,
                    rule="meamed", q=1, worker_momentum=0.9, seed=3).validate()
    attack = AttackConfig.build(worker_attack="alie", byzantine_workers=(1, 3),
                                proxy_attack="gambler", gambler_p=2e-6, gambler_scale=1.5,
                                corrupt_params=True).validate(cfg)
    slow: list[tuple[int, int]] = []
    original = worker_step.byzantine_gradient

    def counting(*args, **kwargs):
        slow.append((args[4], args[5]))  # (round, worker)
        return original(*args, **kwargs)

    monkeypatch.setattr(worker_step, "byzantine_gradient", counting)
    natural = simulate(cfg, attack)
    # with this seed: worker 1's view differs from round 1 on, worker 3's from round 2;
    # round 0 is the shortcut for both (momenta copied at the switch are not zero)
    assert slow and min(t for t, _ in slow) >= 1
    assert {w for _, w in slow} == {1, 3}
    assert len(slow) < 2 * cfg.rounds
    monkeypatch.setattr(engine.Simulation, "_pulled_alike",
                        staticmethod(lambda views, worker, others: False))
    slow.clear()
    tracked = simulate(cfg, attack)
    assert len(slow) == 2 * cfg.rounds
    assert natural.digest == tracked.digest
    np.testing.assert_array_equal(natural.params, tracked.params)
