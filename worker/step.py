"""One worker's step of round t: what worker i pushes after pulling x^t.

An honest worker pushes its stochastic gradient g_i^t (``worker/trainer.py``), or with
``--worker-momentum`` its momentum vector (:class:`~worker.trainer.Momentum`); a
Byzantine worker pushes the row it forges (``worker/byzantine.py``). The worker process
(``worker/run.py``) and the reference engine (``ps/reference/engine.py``) both run
this step, one :class:`WorkerStep` per worker, so the engine cannot drift from the
worker.
"""

from __future__ import annotations

import numpy as np

from common.run.buffers import HostBuffers
from common.run.config import AttackConfig, RunConfig
from worker.byzantine import ByzantineState, byzantine_gradient
from worker.trainer import GradientComputer, Momentum


class WorkerStep:
    """Worker ``worker``'s vector of each round, and what it carries from round to
    round: its momentum (honest), or its :class:`ByzantineState` (Byzantine). Process
    state: a worker restarted starts again from zero. An honest worker's vectors are
    written into ``buffers``' (reused once nothing references them: sent, and out of the
    replay window), or into new arrays."""

    def __init__(self, cfg: RunConfig, attack: AttackConfig, computer: GradientComputer,
                 worker: int, buffers: HostBuffers | None = None) -> None:
        self.cfg = cfg
        self.attack = attack
        self.computer = computer
        self.worker = worker
        self.buffers = buffers
        self.byzantine = attack.is_byzantine(worker)
        self.momentum = Momentum(cfg.worker_momentum, buffers)
        self.state = ByzantineState.start(cfg, attack) if self.byzantine else None

    def __call__(self, x: np.ndarray, round_: int) -> tuple[np.ndarray, float]:
        """(the vector to push at ``round_`` after pulling ``x``, the minibatch loss; NaN
        for a Byzantine worker)."""
        if self.byzantine:
            g = byzantine_gradient(self.cfg, self.attack, self.computer, x, round_,
                                   self.worker, state=self.state)
            return g, float("nan")
        g, loss = self.computer.gradient(x, round_, self.worker, out=self.vector())
        return self.momentum(g), loss

    def vector(self) -> np.ndarray:
        """A float32 (d,) vector for this round's gradient: one of ``buffers``', or new."""
        if self.buffers is None:
            return np.empty(self.computer.d, np.float32)
        return self.buffers.take()

    def push(self, gradient: np.ndarray) -> np.ndarray:
        """The vector an honest worker pushes after ``gradient`` (in a vector of
        :meth:`vector`), computed elsewhere: the reference engine's batched call."""
        return self.momentum(gradient)
