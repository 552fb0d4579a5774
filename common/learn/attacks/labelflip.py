"""Label flipping: a Byzantine worker computes an honest gradient, on its own partition and
minibatch, of the labels y mapped to ``num_classes - 1 - y`` (9 - y for 10 classes)
(classic model; the label-flipping attack of Allen-Zhu et al., ICLR 2021, and of
Karimireddy, He, Jaggi, "Learning from History", ICML 2021; ByzFL's and Blades'
``LabelFlipping``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from common.conf.settings import WORKER
from common.learn.attacks.base import VectorAttack, register_attack


def flip_labels(targets: Any, num_classes: int) -> Any:
    """``num_classes - 1 - y`` for each label y (an int tensor or array); 9 - y for 10
    classes, as ByzFL's ``targets.sub(nb_labels - 1).mul(-1)``."""
    if num_classes < 2:
        raise ValueError(f"label flipping needs at least 2 classes, got {num_classes}")
    return (num_classes - 1) - targets


@register_attack
@dataclass(frozen=True)
class LabelFlip(VectorAttack):
    """The gradient of the flipped labels on the worker's own data (with the run's worker
    momentum, like any worker's): computed by the Byzantine worker's trainer
    (``worker/byzantine.py``), so Byzantine workers only."""

    name: ClassVar[str] = "labelflip"
    summary: ClassVar[str] = ("the worker's own gradient of the labels y → 9 - y "
                              "(num_classes - 1 - y), momentum as a correct worker's")
    sites: ClassVar[frozenset[str]] = frozenset({WORKER})
    reads_honest: ClassVar[bool] = False
    trains: ClassVar[bool] = True

    def relabel(self, targets: Any, num_classes: int) -> Any:
        return flip_labels(targets, num_classes)

    def forge(self, honest: np.ndarray, num_byzantine: int, rng: np.random.Generator,
              num_workers: int) -> np.ndarray:
        raise NotImplementedError("label flipping is computed by the Byzantine worker's "
                                  "trainer (worker/byzantine.py), not forged from vectors")
