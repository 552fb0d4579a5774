"""Stochastic gradients of the model on one worker's data partition.

Worker i at round t computes g_i^t = grad f(x^t; minibatch) where the minibatch
is drawn from its own partition of the training set (``--partition``) with a stream derived
from (seed, worker, round), and dropout (CNN) draws from a stream derived from
the same coordinates: the same gradient in a worker process and in the
in-process reference engine. A label-flipping Byzantine worker computes the same
gradient of its own minibatch with the labels mapped (``relabel``).

With worker momentum (``--worker-momentum``) a worker pushes its momentum vector
(:class:`Momentum`) instead of the gradient.

The model computes on the process's device (``worker/device.py``): x^t is loaded into its
parameters with one copy from a host vector, and the gradient, accumulated on the device
in one flat vector, is copied out with one copy into a host vector the caller reuses
(``common/run/buffers.py``); on the CPU the model's flat vectors are numpy's, allocated once.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from common.learn.data import Dataset, minibatch_indices, run_partitions
from common.learn.models import build_model, share_flat_storage
from common.learn.seeding import derive_int_seed
from common.run.buffers import HostBuffers
from common.run.config import RunConfig


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor,
                  reduction: str = "mean") -> torch.Tensor:
    """The cross-entropy loss of ``logits`` (softmax inside) for class ``targets``; on a
    CUDA device as the mean (or sum) of the targets' log-softmax, picked with ``gather``:
    ``F.cross_entropy``'s NLL kernel has no deterministic CUDA implementation, which
    ``torch.use_deterministic_algorithms`` refuses."""
    if logits.device.type != "cuda":
        return F.cross_entropy(logits, targets, reduction=reduction)
    picked = F.log_softmax(logits, dim=1).gather(1, targets[:, None]).squeeze(1)
    return -(picked.sum() if reduction == "sum" else picked.mean())


class GradientComputer:
    """Computes any worker's gradient at given parameters (one model, reused), on
    ``device`` (default the CPU)."""

    def __init__(self, cfg: RunConfig, dataset: Dataset,
                 device: torch.device | None = None) -> None:
        self.cfg = cfg
        self.dataset = dataset
        self.device = device or torch.device("cpu")
        model = build_model(cfg.model, dataset.input_shape, dataset.num_classes, cfg.seed)
        self.model = model.to(self.device)
        self.partitions = run_partitions(cfg, dataset)
        self.d = sum(p.numel() for p in self.model.parameters())
        self.uses_dropout = any(isinstance(m, torch.nn.Dropout) for m in self.model.modules())
        # x^t is loaded with one copy; backward accumulates into the flat gradient
        self.flat_params, self.flat_grads = share_flat_storage(self.model)
        # the host vector the parameters were last loaded from: the workers of a process
        # compute one after the other from the same x^t, loaded once (holding it keeps a
        # pool from handing it out again, so its values are still the model's)
        self._loaded: np.ndarray | None = None

    def load(self, x: np.ndarray) -> None:
        """Load parameters ``x`` (float32 (d,)) into the model, unless it is the very
        array loaded last time, whose values must not have changed since (a received x^t
        is only read)."""
        if x.dtype != np.float32 or x.shape != (self.d,):
            raise ValueError(f"parameters must be float32 of shape ({self.d},), got "
                             f"{x.dtype} {x.shape}")
        if x is not self._loaded:
            with torch.no_grad():
                self.flat_params.copy_(_host_tensor(x))
            self._loaded = x

    def gradient(self, x: np.ndarray, round_: int, worker: int,
                 relabel: Callable[[Any, int], Any] | None = None,
                 out: np.ndarray | None = None) -> tuple[np.ndarray, float]:
        """(g_worker^round as float32 (d,), minibatch loss) at parameters ``x``; with
        ``relabel``, of the labels ``relabel(targets, num_classes)`` (label flipping).
        The gradient is copied into ``out`` (a float32 (d,) host vector, returned), or
        into a new array. ``x`` is loaded as :meth:`load` loads it."""
        self.load(x)
        if out is None:
            out = np.empty(self.d, dtype=np.float32)
        elif out.dtype != np.float32 or out.shape != (self.d,):
            raise ValueError(f"the gradient's vector must be float32 of shape ({self.d},), "
                             f"got {out.dtype} {out.shape}")
        self.model.train()
        self.flat_grads.zero_()
        idx = minibatch_indices(
            self.partitions[worker], self.cfg.batch_size, self.cfg.seed, worker, round_
        )
        index = torch.from_numpy(np.asarray(idx, dtype=np.int64))
        inputs = self.dataset.train_x.index_select(0, index).to(self.device)
        targets = self.dataset.train_y.index_select(0, index)
        if relabel is not None:
            targets = relabel(targets, self.dataset.num_classes)
        targets = targets.to(self.device)
        if self.uses_dropout:
            with torch.random.fork_rng(devices=_devices_of(self.device)):
                # this device's generator only: torch.manual_seed also seeds CUDA lazily
                seed = derive_int_seed(self.cfg.seed, "dropout", worker, round_)
                _generator(self.device).manual_seed(seed)
                loss = cross_entropy(self.model(inputs), targets)
        else:
            loss = cross_entropy(self.model(inputs), targets)
        loss.backward()
        torch.from_numpy(out).copy_(self.flat_grads)
        return out, float(loss.detach())


def _host_tensor(x: np.ndarray) -> torch.Tensor:
    """A tensor sharing host vector ``x``'s memory, a read-only one too (it is only read:
    torch warns that it could be written)."""
    if x.flags.writeable:
        return torch.from_numpy(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(x)


def _devices_of(device: torch.device) -> list[int]:
    """The CUDA devices whose generators ``fork_rng`` saves and restores."""
    return [device.index or 0] if device.type == "cuda" else []


def _generator(device: torch.device) -> torch.Generator:
    """``device``'s default random generator (dropout draws from it)."""
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index or 0]
    return torch.random.default_generator


class Momentum:
    """One worker's momentum: ``m_t = beta * m_(t-1) + (1 - beta) * g_t`` with ``m_(-1) =
    0`` (ByzFL's honest client: ``m.mul_(beta).add_(g, alpha=1 - beta)``), in float32 as
    ``float32(beta) * m + float32(1 - beta) * g``; with ``beta = 0`` the gradient itself,
    untouched (the paper's SGD). With ``buffers`` (``common.run.buffers.HostBuffers``) each
    ``m_t`` is written into one of its vectors, and ``g_t`` is scaled in place."""

    def __init__(self, beta: float, buffers: HostBuffers | None = None) -> None:
        if not 0 <= beta < 1:
            raise ValueError(f"momentum beta must be in [0, 1), got {beta!r}")
        self.beta = float(beta)
        self.buffers = buffers
        self.m: np.ndarray | None = None  # m_(t-1); None: zero (no round yet)

    def __call__(self, g: np.ndarray) -> np.ndarray:
        """``m_t`` after gradient ``g`` (a new array, never modified afterwards; with
        ``buffers``, ``g`` is scaled by ``1 - beta`` in place, else left as it was)."""
        if self.beta == 0:
            return g
        beta, rest = np.float32(self.beta), np.float32(1.0 - self.beta)
        with np.errstate(over="ignore", invalid="ignore"):
            if self.buffers is None:
                previous = np.zeros_like(g) if self.m is None else self.m
                self.m = beta * previous + rest * g
                return self.m
            m = self.buffers.take()
            if self.m is None:
                m.fill(0)
            else:
                np.multiply(beta, self.m, out=m)
            np.multiply(rest, g, out=g)
            np.add(m, g, out=m)
        self.m = m
        return m

    def copy(self) -> Momentum:
        out = Momentum(self.beta, self.buffers)
        out.m = self.m  # never modified in place
        return out
