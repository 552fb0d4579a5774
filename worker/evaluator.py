"""The evaluator: a read-only client that measures the model every k rounds.

It pulls a consistent snapshot x^t from every shard (servers keep a few past
rounds so a lagging reader still gets round t everywhere), and writes test
loss, top-1 and top-3 accuracy as JSON lines: the record that tells whether
training survived the attack. Under ``--validation`` the figures are the held-out
part of the training set's instead (``Evaluator.split``; the run's ``config.json``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from common.errors import PeerError
from common.learn.data import Dataset, run_dataset
from common.learn.data.validation import check_split
from common.learn.models import build_model, load_flat_parameters
from common.net.keys import KeyRing
from common.net.protocol import ErrorCode
from common.run.config import RunConfig
from common.run.metrics import JsonlWriter
from common.run.process import check_stop
from worker.client import ClusterClient
from worker.core import RetryPolicy, ServerRefused
from worker.device import describe, resolve_device
from worker.options import ClientOptions, EvalOptions
from worker.trainer import cross_entropy

log = logging.getLogger("ps.evaluator")

EVAL_BATCH = 1000


@dataclass(frozen=True)
class Evaluation:
    """Test-set figures of one parameter vector."""

    loss: float
    top1: float
    top3: float


class Evaluator:
    """Evaluates flat parameter vectors on the run's evaluation set, the test set or its
    validation split (``split``; or its first ``max_samples``), on ``device`` (default the
    CPU; the batches move there as they are evaluated). ``ValueError`` for a dataset not
    built for ``cfg`` (``run_dataset``)."""

    def __init__(self, cfg: RunConfig, dataset: Dataset, max_samples: int | None = None,
                 device: torch.device | None = None) -> None:
        check_split(dataset, cfg.validation)
        self.split = dataset.evaluated_on
        self.device = device or torch.device("cpu")
        self.model = build_model(cfg.model, dataset.input_shape, dataset.num_classes,
                                 cfg.seed).to(self.device)
        count = len(dataset.test_y)
        if max_samples is not None:
            count = min(max_samples, count)
        self.x = dataset.test_x[:count]
        self.y = dataset.test_y[:count]

    @torch.no_grad()
    def evaluate(self, params: np.ndarray) -> Evaluation:
        load_flat_parameters(self.model, torch.from_numpy(params).to(self.device))
        self.model.eval()
        loss_sum, top1, top3 = 0.0, 0, 0
        for i in range(0, len(self.y), EVAL_BATCH):
            logits = self.model(self.x[i : i + EVAL_BATCH].to(self.device))
            target = self.y[i : i + EVAL_BATCH].to(self.device)
            loss_sum += float(cross_entropy(logits, target, reduction="sum"))
            best = logits.topk(min(3, logits.shape[1]), dim=1).indices
            top1 += int((best[:, 0] == target).sum())
            top3 += int((best == target[:, None]).any(dim=1).sum())
        count = len(self.y)
        return Evaluation(loss=loss_sum / count, top1=top1 / count, top3=top3 / count)


def run_evaluator(cfg: RunConfig, options: ClientOptions, evaluation: EvalOptions,
                  out_dir: Path | None, keys: KeyRing | None = None) -> None:
    """Evaluate rounds 0, k, 2k, ... and the last round; write ``evaluator.jsonl``."""
    every = evaluation.eval_every
    device = resolve_device(options.device)
    dataset = run_dataset(cfg, options.data_dir)
    evaluator = Evaluator(cfg, dataset, evaluation.eval_samples, device)
    log.info("evaluating on %s", describe(device))
    policy = RetryPolicy(timeout_s=options.timeout_s, retries=options.retries)
    d = sum(p.numel() for p in evaluator.model.parameters())
    client = ClusterClient(options.server_list(cfg.num_shards), cfg, "evaluator", -1, policy, keys,
                           d=d)
    metrics = JsonlWriter(out_dir / "evaluator.jsonl" if out_dir else None)
    try:
        client.hello()
        t = 0
        while True:
            check_stop()
            try:
                params = client.pull(t)
            except ServerRefused as exc:
                if exc.code != ErrorCode.STALE_ROUND.value:
                    raise
                if not t < exc.round <= cfg.rounds:  # no honest server says so
                    raise PeerError(f"a server says round {t} is stale at round "
                                    f"{exc.round}, not one of {t + 1}..{cfg.rounds}") from exc
                t = _next_round(exc.round, every, cfg.rounds)  # fell behind: catch up
                log.warning("round no longer available; skipping to round %d", t)
                continue
            result = evaluator.evaluate(params)
            metrics.write({"time": time.time(), "round": t, "loss": result.loss,
                           "top1": result.top1, "top3": result.top3})
            log.info("round %d: %s loss %.4f top-1 %.4f top-3 %.4f",
                     t, evaluator.split, result.loss, result.top1, result.top3)
            if t >= cfg.rounds:
                return
            t = _next_round(t + 1, every, cfg.rounds)
    finally:
        client.close()
        metrics.close()


def _next_round(at_least: int, every: int, last: int) -> int:
    """The first multiple of ``every`` >= ``at_least``, capped at the last round."""
    return min(-(-at_least // every) * every, last)
