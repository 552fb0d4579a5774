"""The contract every aggregation rule shares: ``RuleError``, argument checks, ``Rule``.

Rules follow Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant SGD" (ICML 2018): a
rule maps the (n, d) float32 matrix of n workers' gradients to one (d,) gradient, with at
most q Byzantine values per coordinate (or q Byzantine rows, for the classic model).
"""

from __future__ import annotations

import math
import operator
from typing import Any, ClassVar

import torch


class RuleError(ValueError):
    """A rule was asked for something it cannot do (bad name, option, n, q or input)."""


def as_int(value: Any, what: str) -> int:
    """``value`` as an int (bools and non-integral numbers are refused)."""
    if isinstance(value, bool):
        raise RuleError(f"{what} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise RuleError(f"{what} must be an integer, got {value!r}") from None


def as_positive_float(value: Any, what: str) -> float:
    """``value`` as a finite float > 0."""
    if isinstance(value, bool):
        raise RuleError(f"{what} must be a positive number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise RuleError(f"{what} must be a positive number, got {value!r}") from None
    if not (math.isfinite(number) and number > 0):
        raise RuleError(f"{what} must be a positive number, got {value!r}")
    return number


def median_bound(n: int) -> int:
    """Largest q with dimensional Byzantine resilience: ``ceil(n/2) - 1``."""
    return (n + 1) // 2 - 1


class Rule:
    """Base of all rules: configuration checked in ``__init__``, the math in ``aggregate``.

    Subclasses set ``name`` and ``options`` (the keyword options they accept), may
    override ``check`` (preconditions on n, q and options) and implement ``aggregate``.
    """

    name: ClassVar[str]
    options: ClassVar[tuple[str, ...]] = ()

    def __init__(self, n: int, q: int) -> None:
        self.n = as_int(n, "n")
        self.q = as_int(q, "q")
        if self.n < 1:
            raise RuleError(f"{self.name} needs n >= 1, got n={self.n}, q={self.q}")
        if not 0 <= self.q < self.n:
            raise RuleError(f"{self.name} needs 0 <= q < n, got n={self.n}, q={self.q}")
        self.last_info: dict[str, Any] = {}

    def __call__(self, G: torch.Tensor) -> torch.Tensor:
        """Aggregate the (n, d) float32 matrix ``G`` into a (d,) float32 tensor.

        ``G`` is never modified; a non-contiguous ``G`` is copied first.
        """
        X = self.validate_input(G)
        self.last_info = {}
        return self.aggregate(X)

    def validate_input(self, G: Any) -> torch.Tensor:
        """``G`` as a contiguous CPU float32 (n, d) tensor with d >= 1, or ``RuleError``."""
        if not isinstance(G, torch.Tensor):
            raise RuleError(f"{self.name} expects a torch.Tensor, got {type(G).__name__}")
        if G.dtype != torch.float32:
            raise RuleError(f"{self.name} expects dtype float32, got {G.dtype}")
        if G.ndim != 2:
            raise RuleError(f"{self.name} expects a 2-D (n, d) tensor, got shape {tuple(G.shape)}")
        if G.shape[0] != self.n:
            raise RuleError(f"{self.name} was built for n={self.n} rows, got {G.shape[0]}")
        if G.shape[1] == 0:
            raise RuleError(f"{self.name} expects d >= 1 coordinates, got d=0")
        if G.device.type != "cpu":
            raise RuleError(f"{self.name} expects a CPU tensor, got device {G.device}")
        return G.detach().contiguous()

    def aggregate(self, G: torch.Tensor) -> torch.Tensor:
        """The rule itself, on a validated contiguous (n, d) float32 CPU tensor."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.n}, q={self.q})"
