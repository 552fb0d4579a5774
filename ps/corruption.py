"""What the man-in-the-middle does to the traffic of one shard (no sockets).

The proxy (``ps/proxy.py``) and the reference engine (``ps/simulate.py``) call
the same methods, and every random draw comes from a stream derived from
(seed, attack, round, worker, shard), so the corruption does not depend on the
order in which messages arrive.

* gambler (generalized model, paper Section 6): every value of every push to
  this shard is multiplied by ``gambler_scale`` with probability ``gambler_p``;
* bitflip (generalized model): for each of the first ``bitflip_coords``
  coordinates of the *model*, one of the n workers (drawn per round) has the
  chosen bits of its value flipped; this proxy does the ones in its shard;
* gaussian (classic model): the pushes of ``proxy_victims`` are replaced by
  N(0, sd^2) vectors;
* omniscient (classic model): the pushes of ``proxy_victims`` are replaced by
  -scale times the sum of the correct pushes of the round, so the proxy must
  see the whole round first (``whole_round``).
"""

from __future__ import annotations

import numpy as np

from common.attacks import bitflip_victims, flip_bits, gambler, gaussian, omniscient
from common.config import AttackConfig, RunConfig
from common.seeding import derive_rng

NO_CHANGE = 0


class ShardCorruptor:
    """Corrupts pushes (and optionally PARAMS replies) of shard ``shard`` = [start, stop)."""

    def __init__(self, cfg: RunConfig, attack: AttackConfig, shard: int, start: int, stop: int):
        self.cfg = cfg
        self.attack = attack
        self.kind = attack.proxy_attack
        self.shard = shard
        self.start, self.stop = start, stop

    @property
    def whole_round(self) -> bool:
        """True when the pushes of a round must all be seen before any is forwarded."""
        return self.kind == "omniscient"

    def corrupt_push(
        self, round_: int, worker: int, values: np.ndarray
    ) -> tuple[np.ndarray, int]:
        """(values to forward, number of values changed) for one push."""
        if self.kind == "gaussian" and worker in self.attack.proxy_victims:
            rng = derive_rng(self.cfg.seed, "proxy-gaussian", round_, worker, self.shard)
            empty = np.empty((1, values.size), dtype=np.float32)
            return gaussian(empty, 1, rng, sd=self.attack.gaussian_sd)[0], values.size
        return self._value_level(round_, worker, values, "push")

    def corrupt_round(self, round_: int, pushes: list[np.ndarray]) -> tuple[list[np.ndarray], int]:
        """Omniscient: replace the victims' pushes (``pushes`` ordered by worker id)."""
        victims = self.attack.proxy_victims
        honest = np.stack([p for i, p in enumerate(pushes) if i not in victims])
        rng = derive_rng(self.cfg.seed, "proxy-omniscient", round_, self.shard)
        forged = omniscient(honest, len(victims), rng, scale=self.attack.omniscient_scale)
        out = list(pushes)
        for row, worker in enumerate(victims):
            out[worker] = forged[row]
        return out, len(victims) * honest.shape[1]

    def corrupt_params(
        self, round_: int, worker: int, values: np.ndarray
    ) -> tuple[np.ndarray, int]:
        """PARAMS reply to ``worker`` (-1: the evaluator, never corrupted)."""
        if not self.attack.corrupt_params or worker < 0:
            return values, NO_CHANGE
        return self._value_level(round_, worker, values, "params")

    def _value_level(
        self, round_: int, worker: int, values: np.ndarray, what: str
    ) -> tuple[np.ndarray, int]:
        if self.kind == "gambler":
            rng = derive_rng(self.cfg.seed, f"proxy-gambler-{what}", round_, worker, self.shard)
            return gambler(values, rng, p=self.attack.gambler_p, scale=self.attack.gambler_scale)
        if self.kind == "bitflip":
            coords = self._bitflip_coords(round_, worker, what)
            if coords.size == 0:
                return values, NO_CHANGE
            return flip_bits(values, coords, self.attack.bitflip_bits)
        return values, NO_CHANGE

    def _bitflip_coords(self, round_: int, worker: int, what: str) -> np.ndarray:
        """Local indices of this shard's coordinates whose value from ``worker`` is flipped."""
        k = self.attack.bitflip_coords
        if self.start >= k:
            return np.empty(0, dtype=np.int64)
        rng = derive_rng(self.cfg.seed, f"proxy-bitflip-{what}", round_)
        victims = bitflip_victims(self.cfg.num_workers, k, rng)
        local = victims[self.start : min(self.stop, k)]
        return np.flatnonzero(local == worker)
