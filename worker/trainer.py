"""Stochastic gradients of the model on one worker's data partition.

Worker i at round t computes g_i^t = grad f(x^t; minibatch) where the minibatch
is drawn from its own partition of the training set (``--partition``) with a stream derived
from (seed, worker, round), and dropout (CNN) draws from a stream derived from
the same coordinates: the same gradient in a worker process and in the
in-process reference engine. A label-flipping Byzantine worker computes the same
gradient of its own minibatch with the labels mapped (``relabel``).

With worker momentum (``--worker-momentum``) a worker pushes its momentum vector
(:class:`Momentum`) instead of the gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from common.config import RunConfig
from common.data import Dataset, minibatch_indices, run_partitions
from common.models import build_model, share_flat_storage
from common.seeding import derive_int_seed


class GradientComputer:
    """Computes any worker's gradient at given parameters (one model, reused)."""

    def __init__(self, cfg: RunConfig, dataset: Dataset) -> None:
        self.cfg = cfg
        self.dataset = dataset
        self.model = build_model(cfg.model, dataset.input_shape, dataset.num_classes, cfg.seed)
        self.partitions = run_partitions(cfg, dataset)
        self.d = sum(p.numel() for p in self.model.parameters())
        self.uses_dropout = any(isinstance(m, torch.nn.Dropout) for m in self.model.modules())
        # x^t is loaded with one copy; backward accumulates into the flat gradient
        self.flat_params, self.flat_grads = share_flat_storage(self.model)
        self._params_view = self.flat_params.numpy()

    def gradient(self, x: np.ndarray, round_: int, worker: int,
                 relabel: Callable[[Any, int], Any] | None = None) -> tuple[np.ndarray, float]:
        """(g_worker^round as float32 (d,), minibatch loss) at parameters ``x``; with
        ``relabel``, of the labels ``relabel(targets, num_classes)`` (label flipping)."""
        if x.dtype != np.float32 or x.shape != (self.d,):
            raise ValueError(f"parameters must be float32 of shape ({self.d},), got "
                             f"{x.dtype} {x.shape}")
        self._params_view[:] = x
        self.model.train()
        self.flat_grads.zero_()
        idx = minibatch_indices(
            self.partitions[worker], self.cfg.batch_size, self.cfg.seed, worker, round_
        )
        index = torch.from_numpy(np.asarray(idx, dtype=np.int64))
        inputs = self.dataset.train_x.index_select(0, index)
        targets = self.dataset.train_y.index_select(0, index)
        if relabel is not None:
            targets = relabel(targets, self.dataset.num_classes)
        if self.uses_dropout:
            with torch.random.fork_rng(devices=[]):
                # the CPU generator only: torch.manual_seed also seeds CUDA lazily (~ms)
                torch.random.default_generator.manual_seed(
                    derive_int_seed(self.cfg.seed, "dropout", worker, round_)
                )
                loss = F.cross_entropy(self.model(inputs), targets)
        else:
            loss = F.cross_entropy(self.model(inputs), targets)
        loss.backward()
        return self.flat_grads.clone().numpy(), float(loss.detach())


class Momentum:
    """One worker's momentum: ``m_t = beta * m_(t-1) + (1 - beta) * g_t`` with ``m_(-1) =
    0`` (ByzFL's honest client: ``m.mul_(beta).add_(g, alpha=1 - beta)``), in float32 as
    ``float32(beta) * m + float32(1 - beta) * g``; with ``beta = 0`` the gradient itself,
    untouched (the paper's SGD)."""

    def __init__(self, beta: float) -> None:
        if not 0 <= beta < 1:
            raise ValueError(f"momentum beta must be in [0, 1), got {beta!r}")
        self.beta = float(beta)
        self.m: np.ndarray | None = None  # m_(t-1); None: zero (no round yet)

    def __call__(self, g: np.ndarray) -> np.ndarray:
        """``m_t`` after gradient ``g`` (a new array; ``g`` is not modified)."""
        if self.beta == 0:
            return g
        previous = np.zeros_like(g) if self.m is None else self.m
        with np.errstate(over="ignore", invalid="ignore"):
            self.m = np.float32(self.beta) * previous + np.float32(1.0 - self.beta) * g
        return self.m

    def copy(self) -> Momentum:
        out = Momentum(self.beta)
        out.m = self.m  # never modified in place
        return out
