"""The model's initial flat parameter vector, identical on every node of a run."""

from __future__ import annotations

import numpy as np

from common.learn.data import dataset_shape
from common.learn.models import build_model, flatten_parameters
from common.run.config import RunConfig


def initial_parameters(cfg: RunConfig) -> np.ndarray:
    """x^0 as a float32 vector: the model built deterministically from ``cfg.seed``."""
    input_shape, num_classes = dataset_shape(cfg.dataset)
    model = build_model(cfg.model, input_shape, num_classes, cfg.seed)
    return flatten_parameters(model).numpy()
