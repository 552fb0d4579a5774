"""Byzantine workers of the classic model: whole gradient vectors replaced.

A Byzantine worker is omniscient and colluding, the strongest classic
adversary: it recomputes the honest workers' gradients (their data partitions
and minibatch streams are derived from the public run seed), forges the
vectors of all Byzantine workers at once with a stream derived from
(seed, round), and sends its own row. Every Byzantine process thus forges the
same matrix, and the reference engine reproduces it exactly.
"""

from __future__ import annotations

import numpy as np

from common.attacks import VectorAttack
from common.config import AttackConfig, RunConfig
from worker.trainer import GradientComputer


def honest_workers(cfg: RunConfig, attack: AttackConfig) -> list[int]:
    return [i for i in range(cfg.num_workers) if i not in attack.byzantine_workers]


def forge(cfg: RunConfig, attack: AttackConfig, honest: np.ndarray, round_: int) -> np.ndarray:
    """The (len(byzantine_workers), d) vectors the Byzantine workers send at ``round_``."""
    impl: VectorAttack = attack.attack(attack.worker_attack)  # type: ignore[assignment]
    return impl.forge_at(honest, len(attack.byzantine_workers), cfg.num_workers, cfg.seed,
                         "worker-attack", round_)


def byzantine_gradient(
    cfg: RunConfig,
    attack: AttackConfig,
    computer: GradientComputer,
    x: np.ndarray,
    round_: int,
    worker: int,
) -> np.ndarray:
    """What Byzantine ``worker`` pushes at ``round_`` after pulling parameters ``x``."""
    honest = np.stack(
        [computer.gradient(x, round_, i)[0] for i in honest_workers(cfg, attack)]
    )
    return forge(cfg, attack, honest, round_)[attack.byzantine_workers.index(worker)]
