"""The adaptive mimic attack (Karimireddy, He, Jaggi, ICLR 2022; ``MimicVariantAttacker`` of
their code): its power iteration, its choice of the worker copied, its warm-up against a
restatement of their loop, its memory in a Byzantine worker and in the reference engine."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from common.conf.settings import PROXY, WORKER
from common.errors import ConfigError
from common.learn.attacks import VectorAttack, attack_names
from common.learn.attacks.mimic_adaptive import (
    MimicAdaptive,
    MimicMemory,
    choose,
    mimic_adaptive,
    power_step,
)
from common.learn.seeding import derive_rng
from common.run.config import AttackConfig, RunConfig
from ps.reference import engine
from ps.reference.engine import Simulation, simulate
from worker.byzantine import ByzantineState

F32 = np.float32


def rounds_of_rows(count: int, h: int = 6, d: int = 20, seed: int = 1) -> list[np.ndarray]:
    """``count`` rounds of h honest rows, spread unevenly over the coordinates."""
    gen = np.random.default_rng(seed)
    scale = gen.uniform(0.1, 3.0, d)
    return [(gen.standard_normal((h, d)) * scale + gen.standard_normal(d)).astype(F32)
            for _ in range(count)]


def spread(eigenvalues: tuple[float, ...], h: int = 8, d: int = 30,
           seed: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """(h float32 rows whose scatter sum_i (g_i - mean)(g_i - mean)^T is U diag(eigenvalues)
    U^T, U: the returned d x k orthonormal columns)."""
    gen = np.random.default_rng(seed)
    u = np.linalg.qr(gen.standard_normal((d, len(eigenvalues))))[0]
    a = gen.standard_normal((h, len(eigenvalues)))
    q = np.linalg.qr(a - a.mean(axis=0))[0]  # orthonormal columns, each summing to 0
    rows = gen.standard_normal(d) + q @ np.diag(np.sqrt(eigenvalues)) @ u.T
    return rows.astype(F32), u


def top_eigenvector(rows: np.ndarray) -> np.ndarray:
    centered = rows.astype(np.float64) - rows.astype(np.float64).mean(axis=0)
    return np.linalg.eigh(centered.T @ centered)[1][:, -1]


def their_loop(rounds: list[np.ndarray], warmup: int, z0: np.ndarray,
               argmax: bool = True) -> list[tuple[int, np.ndarray]]:
    """Their ``omniscient_callback``, restated in float64: each round's (target, z)."""
    out: list[tuple[int, np.ndarray]] = []
    mu = z = np.zeros(0)
    target = 0
    for t, honest in enumerate(rounds):
        g = honest.astype(np.float64)
        avg = g.mean(axis=0)
        if t < warmup:
            if t == 0:
                mu, start = avg, z0
            else:
                mu, start = t / (1 + t) * mu + avg / (1 + t), z
            step = sum(((row - mu) @ start) * (row - mu) for row in g)
            step = step / np.linalg.norm(step)
            z = step if t == 0 else t / (1 + t) * z + step / (1 + t)
            z = z / np.linalg.norm(z)
            values = g @ z
            target = int(np.argmax(values) if argmax else np.argmin(values))
        out.append((target, z))
    return out


# --------------------------------------------------------------------------- the math


def test_a_power_step_is_the_scatter_matrix_times_z() -> None:
    gen = np.random.default_rng(4)
    centered = gen.standard_normal((5, 9))
    z = gen.standard_normal(9)
    np.testing.assert_allclose(power_step(centered, z), (centered.T @ centered) @ z,
                               rtol=1e-12)


def test_the_warmup_converges_to_the_top_eigenvector_of_a_known_scatter() -> None:
    rows, u = spread((9.0, 1.0, 0.25))
    top = top_eigenvector(rows)
    assert abs(top @ u[:, 0]) > 1 - 1e-9  # the construction's top direction
    memory = MimicMemory()
    angles = []
    for _ in range(60):
        mimic_adaptive(rows, 1, np.random.default_rng(3), memory, warmup=60)
        assert memory.direction is not None
        angles.append(np.arccos(min(1.0, abs(float(memory.direction @ top)))))
    # one power step from a random start is not there yet; their averaged steps close the
    # angle every round, slowly (tan shrinks about (k + 1/9) / (k + 1) at round k)
    assert angles[0] > 0.1
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(angles))
    assert angles[-1] < angles[0] / 20 and angles[-1] < 0.02
    np.testing.assert_allclose(memory.mean, rows.astype(np.float64).mean(axis=0), rtol=1e-12)


def test_it_copies_the_worker_furthest_along_the_top_direction() -> None:
    """Rows spread mostly along e_0 by known amounts a_i (and a little along e_1): the worker
    copied is the one with the largest a_i times the sign the direction came out with."""
    a = np.array([0.5, -2.0, 3.0, 1.0, -1.0, -1.5])
    b = np.array([0.3, 0.1, -0.2, -0.4, 0.1, 0.1])
    rows = np.zeros((6, 10), dtype=F32) + F32(1.0)
    rows[:, 0] += a.astype(F32)
    rows[:, 1] += b.astype(F32)
    signs = set()
    for pick, extreme in (("max", np.argmax), ("min", np.argmin)):
        for seed in range(6):  # random starts: the direction comes out with either sign
            memory = MimicMemory()
            for _ in range(5):
                out = mimic_adaptive(rows, 2, np.random.default_rng(seed), memory, warmup=5,
                                     pick=pick)
            assert memory.direction is not None
            sign = np.sign(memory.direction[0])
            signs.add(sign)
            assert abs(memory.direction[0]) > 0.99
            assert memory.target == extreme(sign * a)
            np.testing.assert_array_equal(out, np.stack([rows[memory.target]] * 2))
    assert signs == {-1.0, 1.0}
    assert choose(rows.astype(np.float64), np.eye(10)[1]) == 0  # largest along e_1
    assert choose(rows.astype(np.float64), np.eye(10)[1], "min") == 3


@pytest.mark.parametrize("warmup", [1, 2, 5, 12])
@pytest.mark.parametrize("pick", ["max", "min"])
def test_it_does_what_their_code_does(warmup: int, pick: str) -> None:
    rounds = rounds_of_rows(12, seed=warmup)
    z0 = np.random.default_rng(9).standard_normal(20)
    theirs = their_loop(rounds, warmup, z0, argmax=pick == "max")
    memory = MimicMemory()
    for t, honest in enumerate(rounds):
        out = mimic_adaptive(honest, 3, np.random.default_rng(9), memory, warmup=warmup,
                             pick=pick)
        target, z = theirs[t]
        assert memory.target == target, t
        assert memory.direction is not None
        np.testing.assert_allclose(memory.direction, z, rtol=1e-9, atol=1e-12)
        np.testing.assert_array_equal(out, np.stack([honest[target]] * 3))
    assert memory.rounds == 12 and memory.learned == warmup


def test_after_the_warmup_it_copies_one_fixed_honest_worker() -> None:
    rounds = rounds_of_rows(10, seed=6)
    memory = MimicMemory()
    targets = []
    for t, honest in enumerate(rounds):
        before = honest.copy()
        out = mimic_adaptive(honest, 4, np.random.default_rng(0), memory, warmup=3)
        np.testing.assert_array_equal(honest, before)  # inputs untouched
        assert out.shape == (4, 20) and out.dtype == F32
        copied = [i for i, row in enumerate(honest) if np.array_equal(out[0], row)]
        assert len(copied) == 1 and all(np.array_equal(r, out[0]) for r in out)
        targets.append(copied[0])
        if t == 2:
            learned = (memory.mean, memory.direction)
    assert len(set(targets[2:])) == 1 and memory.target == targets[-1]
    assert memory.mean is learned[0] and memory.direction is learned[1]  # frozen


# --------------------------------------------------------------------------- edge cases


def test_no_honest_worker_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one gradient row"):
        mimic_adaptive(np.zeros((0, 5), dtype=F32), 2, np.random.default_rng(0),
                       MimicMemory())


def test_one_honest_worker_or_equal_rows_keep_the_random_start() -> None:
    for rows in (np.ones((1, 7), dtype=F32), np.ones((4, 7), dtype=F32)):
        memory = MimicMemory()
        for _ in range(3):
            out = mimic_adaptive(rows, 2, np.random.default_rng(5), memory, warmup=3)
        start = np.random.default_rng(5).standard_normal(7)
        assert memory.direction is not None
        np.testing.assert_allclose(memory.direction, start / np.linalg.norm(start))
        assert memory.target == 0  # every projection ties: the lowest id
        np.testing.assert_array_equal(out, np.ones((2, 7), dtype=F32))


def test_a_non_finite_round_teaches_nothing() -> None:
    rounds = rounds_of_rows(5, seed=8)
    bad = rounds[1].copy()
    bad[2, 3] = np.nan
    clean, skipped = MimicMemory(), MimicMemory()
    for honest in (rounds[0], rounds[2]):
        mimic_adaptive(honest, 1, np.random.default_rng(1), clean, warmup=4)
    mimic_adaptive(rounds[0], 1, np.random.default_rng(1), skipped, warmup=4)
    target, direction = skipped.target, skipped.direction
    out = mimic_adaptive(bad, 2, np.random.default_rng(1), skipped, warmup=4)
    assert skipped.target == target and skipped.direction is direction
    np.testing.assert_array_equal(out, np.stack([bad[target]] * 2))
    mimic_adaptive(rounds[2], 1, np.random.default_rng(1), skipped, warmup=4)
    assert skipped.rounds == 3 and skipped.learned == 2 == clean.learned
    assert skipped.target == clean.target
    np.testing.assert_array_equal(skipped.direction, clean.direction)
    # before any finite round: the first honest worker, copied as it is
    first = MimicMemory()
    out = mimic_adaptive(bad, 1, np.random.default_rng(1), first, warmup=2)
    assert first.direction is None and first.target == 0 and first.rounds == 1
    np.testing.assert_array_equal(out[0], bad[0])
    # after the warm-up the target's vector is copied whatever it holds
    fixed = MimicMemory()
    mimic_adaptive(rounds[0], 1, np.random.default_rng(1), fixed, warmup=1)
    later = rounds[3].copy()
    later[fixed.target] = np.inf
    assert np.all(np.isposinf(mimic_adaptive(later, 2, np.random.default_rng(1), fixed)))


def test_a_memory_of_other_shapes_and_bad_settings_are_refused() -> None:
    memory = MimicMemory()
    mimic_adaptive(rounds_of_rows(1, h=6, d=20)[0], 1, np.random.default_rng(0), memory)
    with pytest.raises(ValueError, match="memory holds"):
        mimic_adaptive(rounds_of_rows(1, h=6, d=21)[0], 1, np.random.default_rng(0), memory)
    memory.target = 5
    with pytest.raises(ValueError, match="memory holds"):
        mimic_adaptive(rounds_of_rows(1, h=3, d=20)[0], 1, np.random.default_rng(0), memory)
    rows = rounds_of_rows(1)[0]
    with pytest.raises(ValueError, match="warm-up"):
        mimic_adaptive(rows, 1, np.random.default_rng(0), MimicMemory(), warmup=0)
    with pytest.raises(ValueError, match="pick"):
        mimic_adaptive(rows, 1, np.random.default_rng(0), MimicMemory(), pick="mid")
    with pytest.raises(ValueError, match="needs its memory"):
        MimicAdaptive().forge(rows, 1, np.random.default_rng(0), 8)
    with pytest.raises(ValueError, match="needs its memory"):
        MimicAdaptive().forge_at(rows, 1, 8, 0, "worker-attack", 0)


def test_its_settings_and_where_it_runs() -> None:
    cfg = RunConfig(dataset="synthetic", num_workers=7, rule="marmed").validate()
    attack = AttackConfig.build(worker_attack="mimic-adaptive", byzantine_workers=(1, 4),
                                mimic_adaptive_warmup=30,
                                mimic_adaptive_pick="min").validate(cfg)
    assert attack.attack("mimic-adaptive") == MimicAdaptive(warmup=30, pick="min")
    assert MimicAdaptive() == MimicAdaptive(warmup=1, pick="max")  # their defaults
    for bad in ({"mimic_adaptive_warmup": 0}, {"mimic_adaptive_pick": "mid"}):
        with pytest.raises(ConfigError, match="--mimic-adaptive-"):
            AttackConfig.build(worker_attack="mimic-adaptive", byzantine_workers=(1,),
                               **bad).validate(cfg)
    assert "mimic-adaptive" in attack_names(WORKER)
    assert "mimic-adaptive" not in attack_names(PROXY)
    assert isinstance(ByzantineState.start(cfg, attack).memory, MimicMemory)
    plain = AttackConfig.build(worker_attack="mimic", byzantine_workers=(1,)).validate(cfg)
    assert ByzantineState.start(cfg, plain).memory is None
    impl = plain.attack("mimic")
    assert isinstance(impl, VectorAttack) and not impl.stateful and MimicAdaptive.stateful
    with pytest.raises(TypeError, match="no state"):
        impl.start_memory()


# --------------------------------------------------------------------------- determinism


def test_the_same_seed_forges_the_same_rounds() -> None:
    rounds = rounds_of_rows(6, seed=3)
    attack = MimicAdaptive(warmup=4)

    def run(seed: int) -> tuple[list[np.ndarray], MimicMemory]:
        memory = attack.start_memory()
        return [attack.forge_at(honest, 2, 8, seed, "worker-attack", t, memory=memory)
                for t, honest in enumerate(rounds)], memory

    (first, a), (second, b) = run(7), run(7)
    for x, y in zip(first, second, strict=True):
        np.testing.assert_array_equal(x, y)
    assert a.target == b.target and a.direction is not None and b.direction is not None
    assert a.direction.tobytes() == b.direction.tobytes()
    # the random start is drawn from the run's stream: another seed starts elsewhere
    memory = attack.start_memory()
    attack.forge_at(rounds[0], 2, 8, 7, "worker-attack", 0, memory=memory)
    np.testing.assert_array_equal(memory.direction, _first_direction(rounds[0], 7))
    assert not np.array_equal(_first_direction(rounds[0], 7), _first_direction(rounds[0], 8))


def _first_direction(rows: np.ndarray, seed: int) -> np.ndarray:
    memory = MimicMemory()
    mimic_adaptive(rows, 1, derive_rng(seed, "worker-attack", 0), memory, warmup=2)
    assert memory.direction is not None
    return memory.direction


# --------------------------------------------------------------------------- the engine

ENGINE_CFG = {"dataset": "synthetic", "num_workers": 6, "num_shards": 2, "rounds": 5,
              "rule": "meamed", "q": 2, "seed": 3}


def test_the_engine_forges_with_each_workers_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every round each Byzantine worker copies one honest vector, chosen again during the
    warm-up and fixed after; each keeps its own memory, and forging as a worker process does
    (no shortcut) ends bit for bit where the engine's shortcut does."""
    cfg = RunConfig(**ENGINE_CFG).validate()
    attack = AttackConfig.build(worker_attack="mimic-adaptive", byzantine_workers=(1, 4),
                                mimic_adaptive_warmup=3).validate(cfg)
    seen: list[tuple[int, int, MimicMemory]] = []  # (round, target, memory)
    original = engine.forge

    def recording(cfg_: RunConfig, attack_: AttackConfig, honest: np.ndarray, round_: int,
                  memory: MimicMemory | None = None) -> np.ndarray:
        out = original(cfg_, attack_, honest, round_, memory)
        assert memory is not None
        assert all(np.array_equal(row, honest[memory.target]) for row in out)
        seen.append((round_, memory.target, memory))
        return out

    monkeypatch.setattr(engine, "forge", recording)
    sims: list[Simulation] = []
    result = simulate(cfg, attack, on_round=lambda t, sim: sims.append(sim))
    assert [t for t, _, _ in seen] == [t for t in range(5) for _ in (1, 4)]
    memories = {id(m) for _, _, m in seen}
    assert len(memories) == 2  # one per Byzantine worker
    for i in (1, 4):
        state = sims[-1].workers[i].state
        assert state is not None and state.memory.rounds == 5 and id(state.memory) in memories
    targets = [target for t, target, _ in seen if t >= 2]
    assert len(set(targets)) == 1  # fixed after the warm-up
    assert simulate(cfg, attack).digest == result.digest
    monkeypatch.setattr(engine.Simulation, "_pulled_alike",
                        staticmethod(lambda views, worker, others: False))
    seen.clear()
    assert simulate(cfg, attack).digest == result.digest
    assert not seen  # each worker forged in its own step


def test_verify_will_not_compare_a_run_whose_memory_restarted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory is process state, like momentum: ``ps-cluster --verify`` refuses a run in
    which a worker restarted (its adaptive mimic warmed up again), without momentum too."""
    import json
    from types import SimpleNamespace

    from ps.launcher import cli

    monkeypatch.setattr(cli, "pin_torch_threads", lambda threads: None)
    for i in range(3):
        with (tmp_path / f"worker-{i}.jsonl").open("w") as f:
            for t in range(4):
                f.write(json.dumps({"round": t, "started_at": 2 if i == 1 and t >= 2 else 0})
                        + "\n")
    cfg = RunConfig(dataset="synthetic", num_workers=3, rounds=4, rule="mean", q=0).validate()
    attack = AttackConfig.build(worker_attack="mimic-adaptive",
                                byzantine_workers=(1,)).validate(cfg)
    spec = SimpleNamespace(cfg=cfg, attack=attack, out_dir=tmp_path,
                           process=SimpleNamespace(torch_threads=1))
    with pytest.raises(ConfigError, match=r"--worker-attack mimic-adaptive .* worker\(s\) 1 "):
        cli.verify(spec, "a" * 64)
