"""The run configuration every role shares, validated in one place.

``RunConfig`` holds what must be identical on every node of a run (model,
data, n, S, rule, q, learning rate, batch, rounds, seed). Its ``config_hash``
is compared at the HELLO handshake, so a mis-configured process is refused
with a message naming the settings that differ.

``AttackConfig`` holds the Byzantine behaviour (which workers lie and how,
what the man-in-the-middle proxy corrupts). It is deliberately *not* part of
the hash: an attacker does not announce itself. The in-process reference
engine needs both to reproduce a cluster run bit for bit.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from common.attacks import BITFLIP_PAPER_BITS, BITFLIP_PAPER_COORDS, VECTOR_ATTACKS
from common.data import DATASET_NAMES
from common.errors import ConfigError
from common.models import MODEL_NAMES
from common.rules import RuleError, make_rule

PROXY_ATTACKS = ("none", "gambler", "bitflip", "gaussian", "omniscient")


@dataclass(frozen=True)
class RunConfig:
    """Settings shared by every server, worker, proxy and evaluator of one run."""

    model: str = "mlp"
    dataset: str = "fashion-mnist"
    num_workers: int = 20
    num_shards: int = 4
    rule: str = "marmed"
    q: int | None = None
    multikrum_m: int | None = None
    lr: float = 0.1
    batch_size: int = 32
    rounds: int = 500
    seed: int = 0

    def validate(self) -> RunConfig:
        """Raise ``ConfigError`` naming the offending setting.

        Returns the validated configuration, with ``q`` resolved when it was left
        unset (``None``): see ``default_q``.
        """
        if self.q is None:
            return replace(self, q=default_q(self.rule, self.num_workers)).validate()
        if self.model not in MODEL_NAMES:
            raise ConfigError(f"model must be one of {', '.join(MODEL_NAMES)}, got {self.model!r}")
        if self.dataset not in DATASET_NAMES:
            raise ConfigError(
                f"dataset must be one of {', '.join(DATASET_NAMES)}, got {self.dataset!r}"
            )
        _require(self.num_workers >= 1, f"num_workers must be >= 1, got {self.num_workers}")
        _require(self.num_shards >= 1, f"num_shards must be >= 1, got {self.num_shards}")
        _require(self.lr > 0, f"lr must be > 0, got {self.lr}")
        _require(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        _require(self.rounds >= 1, f"rounds must be >= 1, got {self.rounds}")
        _require(self.seed >= 0, f"seed must be >= 0, got {self.seed}")
        _require(
            0 <= self.q < self.num_workers,
            f"q must satisfy 0 <= q < num_workers={self.num_workers}, got {self.q}",
        )
        try:
            make_rule(self.rule, self.num_workers, self.q, **self.rule_options())
        except RuleError as exc:
            raise ConfigError(f"rule {self.rule!r}: {exc}") from exc
        return self

    def rule_options(self) -> dict[str, Any]:
        """Keyword options for ``make_rule`` derived from this configuration."""
        if self.rule == "multikrum" and self.multikrum_m is not None:
            return {"m": self.multikrum_m}
        return {}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        """Build from a plain dict (e.g. a peer's HELLO), rejecting unknown keys."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown configuration keys: {', '.join(unknown)}")
        return cls(**data)

    @property
    def config_hash(self) -> str:
        """Stable 16-hex-digit hash of the canonical JSON of every setting."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def differences(self, other: dict[str, Any]) -> list[str]:
        """Human-readable ``name: ours != theirs`` for each setting that differs."""
        ours = self.to_dict()
        names = sorted(set(ours) | set(other))
        return [
            f"{k}: {ours.get(k, '<missing>')!r} != {other.get(k, '<missing>')!r}"
            for k in names
            if ours.get(k, "<missing>") != other.get(k, "<missing>")
        ]


@dataclass(frozen=True)
class AttackConfig:
    """Byzantine behaviour of a run (not part of the handshake hash).

    * ``worker_attack`` on ``byzantine_workers``: the classic model, whole vectors,
      computed by the Byzantine worker processes themselves;
    * ``proxy_attack`` on the shards in ``proxy_shards``: the man-in-the-middle
      proxy; gambler/bitflip are value-level (generalized model), gaussian and
      omniscient replace the shards of ``proxy_victims`` (classic model).
    """

    byzantine_workers: tuple[int, ...] = ()
    worker_attack: str = "none"
    proxy_shards: tuple[int, ...] = ()
    proxy_attack: str = "none"
    proxy_victims: tuple[int, ...] = ()
    corrupt_params: bool = False
    gambler_p: float = 5e-4
    gambler_scale: float = -1e20
    bitflip_bits: tuple[int, ...] = BITFLIP_PAPER_BITS
    bitflip_coords: int = BITFLIP_PAPER_COORDS
    gaussian_sd: float = 200.0
    omniscient_scale: float = 1e20
    signflip_scale: float = 1.0
    alie_z: float | None = None
    ipm_epsilon: float = 0.1

    def validate(self, cfg: RunConfig) -> AttackConfig:
        """Check the attack settings against the run; raise ``ConfigError``."""
        n, s = cfg.num_workers, cfg.num_shards
        attacks = ("none", *VECTOR_ATTACKS)
        _require(
            self.worker_attack in attacks,
            f"worker attack must be one of {', '.join(attacks)}, got {self.worker_attack!r}",
        )
        _require(
            self.proxy_attack in PROXY_ATTACKS,
            f"proxy attack must be one of {', '.join(PROXY_ATTACKS)}, got {self.proxy_attack!r}",
        )
        _check_ids("byzantine worker", self.byzantine_workers, n)
        _check_ids("proxy victim worker", self.proxy_victims, n)
        _check_ids("proxy shard", self.proxy_shards, s)
        if self.worker_attack != "none":
            _require(
                bool(self.byzantine_workers),
                f"worker attack {self.worker_attack!r} needs at least one byzantine worker",
            )
            _require(
                len(self.byzantine_workers) < n,
                "at least one worker must be honest for a worker attack",
            )
        if self.proxy_attack in ("gaussian", "omniscient"):
            _require(
                bool(self.proxy_victims),
                f"proxy attack {self.proxy_attack!r} needs --proxy-victims (worker ids)",
            )
            _require(len(self.proxy_victims) < n, "at least one proxy victim must stay honest")
        _require(0.0 <= self.gambler_p <= 1.0, f"gambler p must be in [0, 1], got {self.gambler_p}")
        _require(
            all(0 <= b <= 31 for b in self.bitflip_bits) and len(self.bitflip_bits) > 0,
            f"bit-flip bits must be 0..31, got {self.bitflip_bits}",
        )
        _require(
            self.bitflip_coords >= 0, f"bit-flip coords must be >= 0, got {self.bitflip_coords}"
        )
        _require(self.gaussian_sd >= 0, f"gaussian sd must be >= 0, got {self.gaussian_sd}")
        _require(
            not self.corrupt_params or self.proxy_attack in ("gambler", "bitflip"),
            "corrupting PARAMS replies needs a value-level proxy attack (gambler or bitflip)",
        )
        return self

    def vector_attack_kwargs(self, name: str, n: int) -> dict[str, Any]:
        """Keyword parameters of the vector attack ``name`` from these settings."""
        return {
            "gaussian": {"sd": self.gaussian_sd},
            "omniscient": {"scale": self.omniscient_scale},
            "signflip": {"scale": self.signflip_scale},
            "alie": {"z": self.alie_z, "n": n},
            "ipm": {"epsilon": self.ipm_epsilon},
        }[name]

    def is_byzantine(self, worker: int) -> bool:
        return self.worker_attack != "none" and worker in self.byzantine_workers

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_q(rule: str, n: int) -> int:
    """The q used when none is given: the largest Krum allows, (n-3)//2 (the paper's
    q = 8 for n = 20), or (n-3)//4 for Bulyan (n >= 4q+3); never negative."""
    bound = (n - 3) // 4 if rule == "bulyan" else (n - 3) // 2
    return max(0, bound)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _check_ids(what: str, ids: tuple[int, ...], limit: int) -> None:
    for i in ids:
        _require(0 <= i < limit, f"{what} id {i} out of range 0..{limit - 1}")
    _require(len(set(ids)) == len(ids), f"duplicate {what} ids in {ids}")
