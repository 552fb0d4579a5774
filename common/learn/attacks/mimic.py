"""Mimic (Karimireddy, He, Jaggi, "Byzantine-Robust Learning on Heterogeneous Datasets via
Bucketing", ICLR 2022): every Byzantine worker sends a copy of one honest worker's vector
(classic model)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from common.conf.settings import setting
from common.errors import ConfigError
from common.learn.attacks.base import VectorAttack, check_honest, register_attack, repeat


def mimic(honest: np.ndarray, num_byzantine: int, rng: np.random.Generator,
          index: int = 0) -> np.ndarray:
    """``num_byzantine`` copies of ``honest[index]`` (Karimireddy, He, Jaggi, 2022).

    Which honest vector: ``index`` into the honest rows, which are ordered by worker id, so
    the default 0 is the honest worker with the smallest id, every round (ByzFL's
    ``Mimic(epsilon=0)``). The paper's attacker instead learns, over the first rounds,
    the honest worker along whose direction the honest vectors vary most and mimics it
    from then on (ByzFL's ``WorkerWithMaxVariance``): that is ``mimic-adaptive``
    (``mimic_adaptive.py``); give ``--mimic-index`` to pick another fixed worker.
    Copying a correct vector over-weights that worker's data, which hurts most when the
    data are heterogeneous; on iid partitions it mostly adds variance. ``rng`` is not used.
    """
    check_honest(honest, num_byzantine)
    if not 0 <= index < honest.shape[0]:
        raise ValueError(f"mimic index must be in [0, {honest.shape[0]}) (the honest rows), "
                         f"got {index}")
    return repeat(honest[index], num_byzantine)


@register_attack
@dataclass(frozen=True)
class Mimic(VectorAttack):
    """Copies of one honest worker's vector."""

    name: ClassVar[str] = "mimic"
    function = staticmethod(mimic)
    summary: ClassVar[str] = ("copies of the vector of one correct worker (`--mimic-index` "
                              "into the correct workers by id; 0: the first)")

    index: int = setting(0, "Mimic attack: the correct worker copied, as an index into the "
                         "correct workers ordered by id (0: the one with the smallest id; "
                         "ByzFL's epsilon).", flag="--mimic-index", minimum=0)

    def check(self, num_workers: int, num_byzantine: int) -> None:
        super().check(num_workers, num_byzantine)
        honest = num_workers - num_byzantine
        if self.index >= honest:
            raise ConfigError(f"--mimic-index must be below the {honest} correct workers, "
                              f"got {self.index}")
