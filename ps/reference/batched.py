"""The honest workers' gradients of a round in one batched call (the reference engine).

Where the honest workers all pulled the same x^t, their gradients differ only by their
minibatches. For a model of ``Flatten``, ``Linear`` and ``ReLU`` layers (the paper's MLP:
no dropout, nothing random) on the CPU with one torch thread, :class:`BatchedGradients`
runs one forward pass over the stacked minibatches and a hand-written backward pass, each
worker's weight gradients by one batched matrix product: the operations autograd runs for
one worker (``addmm``, ``_log_softmax_backward_data``, ``threshold_backward``, ``mm``, a
sum over the batch), each row's sums in the same order, so that every worker's gradient
is bit for bit :meth:`~worker.trainer.GradientComputer.gradient`'s. Each worker's
minibatch is the one its process draws (``minibatch_indices``). Whether a BLAS sums a row
of a large product as it sums that row of a small one is its own choice (with two torch
threads they differ here), so the first call is checked against each worker's own
computation, and a difference in any bit turns the batching off for the run.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from common.learn.data import minibatch_indices
from worker.trainer import GradientComputer

log = logging.getLogger("ps.reference")
aten = torch.ops.aten  # the backward operations autograd runs

# above this many values (n x d) the workers compute one by one: the batched call holds
# n gradients at once (the 10.6M-parameter "wide" model would take 850 MB at n = 20)
MAX_VALUES = 1 << 26


class BatchedGradients:
    """Many workers' gradients at one x in one call, on ``computer``'s model and data."""

    def __init__(self, computer: GradientComputer) -> None:
        self.computer = computer
        self.layers = list(computer.model.children())[1:]  # after the Flatten
        self.checked = False  # whether a call was compared with the per-worker path
        self.agrees = True  # what that comparison found

    @staticmethod
    def supports(computer: GradientComputer, workers: int) -> bool:
        """Whether ``workers`` workers' gradients on ``computer`` can be batched: a
        ``Sequential`` of ``Flatten`` first, then ``Linear`` layers with biases and
        ``ReLU``s, on the CPU with one torch thread, at most :data:`MAX_VALUES` values
        in all."""
        model = computer.model
        if (not isinstance(model, nn.Sequential) or computer.device.type != "cpu"
                or torch.get_num_threads() != 1):
            return False
        layers = list(model)
        return (len(layers) > 1 and isinstance(layers[0], nn.Flatten)
                and all(isinstance(m, nn.ReLU)
                        or (isinstance(m, nn.Linear) and m.bias is not None)
                        for m in layers[1:])
                and workers * computer.d <= MAX_VALUES)

    def gradients(self, x: np.ndarray, round_: int, workers: Sequence[int],
                  outs: Sequence[np.ndarray]) -> bool:
        """Write the gradient g_i^round of each of ``workers`` at parameters ``x`` into
        its vector of ``outs`` (float32 (d,)); False, leaving them unwritten or half
        written, where the first call found them other than the per-worker path's (the
        caller computes them one by one)."""
        if not self.agrees:
            return False
        self._compute(x, round_, workers, outs)
        if not self.checked:
            self.checked = True
            self.agrees = all(
                np.array_equal(out.view(np.uint32), self.computer.gradient(
                    x, round_, i)[0].view(np.uint32))
                for i, out in zip(workers, outs, strict=True))
            if not self.agrees:
                log.warning("the batched gradients differ from the per-worker ones here: "
                            "the workers compute one by one")
        return self.agrees

    def _compute(self, x: np.ndarray, round_: int, workers: Sequence[int],
                 outs: Sequence[np.ndarray]) -> None:
        computer, cfg = self.computer, self.computer.cfg
        n, b = len(workers), cfg.batch_size
        computer.load(x)
        index = torch.from_numpy(np.concatenate([
            minibatch_indices(computer.partitions[i], b, cfg.seed, i, round_)
            for i in workers]))
        with torch.no_grad():
            # acts[k]: the input of layer k, acts[k + 1] its output
            acts = [computer.dataset.train_x.index_select(0, index).reshape(n * b, -1)]
            for m in self.layers:
                h = acts[-1]
                acts.append(torch.addmm(m.bias, h, m.weight.t())
                            if isinstance(m, nn.Linear) else torch.relu(h))
            logp = torch.log_softmax(acts[-1], 1)
            # the mean cross-entropy's backward: each worker's loss is a mean over b
            targets = computer.dataset.train_y.index_select(0, index)
            picked = torch.zeros_like(logp).scatter_(1, targets[:, None], -1.0 / b)
            g = aten._log_softmax_backward_data(picked, logp, 1, logp.dtype)
            end = computer.d  # where the layer's parameters end in the flat vector
            for k in reversed(range(len(self.layers))):
                m = self.layers[k]
                if not isinstance(m, nn.Linear):  # a ReLU, from its output
                    g = aten.threshold_backward(g, acts[k + 1], 0)
                    continue
                per = g.view(n, b, m.out_features)
                weight = torch.bmm(per.transpose(1, 2), acts[k].view(n, b, m.in_features))
                start = end - m.bias.numel() - m.weight.numel()
                _write(outs, start, weight.view(n, -1).numpy())
                _write(outs, end - m.bias.numel(), per.sum(1).numpy())
                end = start
                if k:
                    g = g.mm(m.weight)


def _write(outs: Sequence[np.ndarray], start: int, rows: np.ndarray) -> None:
    """Each row of ``rows`` into its vector of ``outs`` from ``start``, added to zero as
    backward adds a gradient into the zeroed ``.grad`` (a -0 would become +0)."""
    for out, row in zip(outs, rows, strict=True):
        np.add(row, np.float32(0), out=out[start:start + row.size])
