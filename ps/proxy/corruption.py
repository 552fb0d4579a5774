"""What the man-in-the-middle does to the traffic of one shard, and of the shards of one
server process (no sockets).

The proxy's core (``ps/proxy/core.py``) and the reference engine
(``ps/reference/engine.py``) call the same methods, and every random draw comes from a
stream derived from (seed, attack, round, worker, shard), so the corruption does not
depend on the order in which messages arrive. What each attack does is its own
module's business (``common/learn/attacks/``); here is only where it strikes:

* a value-level attack (gambler, bitflip; generalized model) corrupts every push to
  this shard, and with ``corrupt_params`` the PARAMS replies to workers;
* a vector attack (classic model) replaces the pushes of ``proxy_victims``: one at a
  time when the forged vectors ignore the honest ones (gaussian), else once the whole
  round is in (``whole_round``: omniscient, signflip, alie, ipm).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from common.learn.attacks import Site, ValueAttack, VectorAttack
from common.net.sharding import ServerSlices
from common.run.config import AttackConfig, RunConfig


class ShardCorruptor:
    """Corrupts pushes (and optionally PARAMS replies) of shard ``shard`` = [start, stop)."""

    def __init__(self, cfg: RunConfig, attack: AttackConfig, shard: int, start: int, stop: int):
        self.cfg = cfg
        self.attack = attack
        # None for a plain relay (proxy attack "none")
        self.impl = attack.params.get(attack.proxy_attack)
        self.victims = attack.proxy_victims
        self.shard = shard
        self.start, self.stop = start, stop

    @property
    def whole_round(self) -> bool:
        """True when the pushes of a round must all be seen before any is forwarded."""
        return self.attack.proxy_holds_rounds

    def corrupt_push(self, round_: int, worker: int, values: np.ndarray) -> tuple[np.ndarray, int]:
        """(values to forward, number of values changed) for one push."""
        impl = self.impl
        if isinstance(impl, ValueAttack):
            return impl.corrupt(values, self._site(round_, worker, "push"))
        if impl is not None and worker in self.victims:
            if not isinstance(impl, VectorAttack):  # a proxy's attack: value or vector level
                raise TypeError(f"{type(impl).__name__} is neither a value nor a vector attack")
            empty = np.empty((1, values.size), dtype=np.float32)
            forged = impl.forge_at(empty, 1, self.cfg.num_workers, self.cfg.seed,
                                   f"proxy-{impl.name}", round_, worker, self.shard)
            return forged[0], values.size
        return values, 0

    def corrupt_round(self, round_: int, pushes: list[np.ndarray]) -> tuple[list[np.ndarray], int]:
        """Replace the victims' pushes (``pushes`` ordered by worker id) with forged ones."""
        honest = np.stack([p for i, p in enumerate(pushes) if i not in self.victims])
        impl = self.impl
        if not isinstance(impl, VectorAttack):  # only a vector attack holds whole rounds
            raise TypeError(f"{type(impl).__name__} does not forge whole rounds")
        forged = impl.forge_at(honest, len(self.victims), self.cfg.num_workers,
                               self.cfg.seed, f"proxy-{impl.name}", round_, self.shard)
        out = list(pushes)
        for row, worker in enumerate(self.victims):
            out[worker] = forged[row]
        return out, len(self.victims) * honest.shape[1]

    def corrupt_params(
        self, round_: int, worker: int, values: np.ndarray
    ) -> tuple[np.ndarray, int]:
        """PARAMS reply to ``worker`` (-1: the evaluator, never corrupted)."""
        impl = self.impl
        if not self.attack.corrupt_params or worker < 0 or not isinstance(impl, ValueAttack):
            return values, 0
        return impl.corrupt(values, self._site(round_, worker, "params"))

    def _site(self, round_: int, worker: int, what: str) -> Site:
        return Site(seed=self.cfg.seed, round=round_, worker=worker, shard=self.shard,
                    start=self.start, num_workers=self.cfg.num_workers, what=what)


class ServerCorruptor:
    """What the proxy in front of a server process does: each shard of ``slices`` in
    ``targets`` is corrupted by its own ``ShardCorruptor`` (its own random streams,
    exactly as a shard alone behind its proxy); the others pass through untouched. The
    methods take and return a message's whole payload (the shards' slices, concatenated
    in shard order)."""

    def __init__(self, cfg: RunConfig, attack: AttackConfig, slices: ServerSlices,
                 targets: Sequence[int]) -> None:
        self.attack = attack
        self.parts = [(offset, b - a, ShardCorruptor(cfg, attack, s, a, b))
                      for s, (a, b), offset in zip(slices.shards, slices.ranges,
                                                   slices.offsets, strict=True)
                      if s in targets]

    @property
    def whole_round(self) -> bool:
        """True when the pushes of a round must all be seen before any is forwarded."""
        return self.attack.proxy_holds_rounds

    def corrupt_push(self, round_: int, worker: int, values: np.ndarray) -> tuple[np.ndarray, int]:
        """(payload to forward, number of values changed) for one push."""
        return self._each(values, lambda c, part: c.corrupt_push(round_, worker, part))

    def corrupt_params(self, round_: int, worker: int,
                       values: np.ndarray) -> tuple[np.ndarray, int]:
        """PARAMS reply to ``worker`` (-1: the evaluator, never corrupted)."""
        return self._each(values, lambda c, part: c.corrupt_params(round_, worker, part))

    def corrupt_round(self, round_: int, pushes: list[np.ndarray]) -> tuple[list[np.ndarray], int]:
        """Replace the victims' slices of the targeted shards in ``pushes`` (payloads
        ordered by worker id, changed in place) with forged ones."""
        changed = 0
        for offset, size, corruptor in self.parts:
            forged, count = corruptor.corrupt_round(
                round_, [p[offset:offset + size] for p in pushes])
            for push, part in zip(pushes, forged, strict=True):
                push[offset:offset + size] = part
            changed += count
        return pushes, changed

    def _each(self, values: np.ndarray, corrupt: Callable[[ShardCorruptor, np.ndarray],
              tuple[np.ndarray, int]]) -> tuple[np.ndarray, int]:
        out, changed = values, 0
        for offset, size, corruptor in self.parts:
            part, count = corrupt(corruptor, values[offset:offset + size])
            if count:
                if out is values:
                    out = np.array(values, copy=True)
                out[offset:offset + size] = part
                changed += count
        return out, changed
