"""How one server node runs (everything but the shared run configuration)."""

from __future__ import annotations

from dataclasses import dataclass

from common.config import RunConfig
from common.errors import ConfigError
from common.rules import RuleError
from common.settings import CLUSTER, SERVER, setting

# Every 8 rounds: a checkpoint (a file written and fsynced, its directory fsynced) costs
# about 1.4 ms of CPU per server and round here, 28 ms a round with 20 servers; the
# workers keep the last 16 rounds' pushes (--replay-rounds) for a server resumed from it.
CHECKPOINT_EVERY = 8
# Rounds of the workers' replay window a checkpoint interval must leave free: the
# checkpoint handed to the writer thread when the server dies may not be on disk yet,
# and one write may have failed.
REPLAY_SLACK = 2


def check_replayable(checkpoint_every: int, replay_rounds: int) -> None:
    """``ConfigError`` unless a server restarted from its last checkpoint (``--resume``)
    gets every round after it replayed by the workers, who keep ``replay_rounds``."""
    if checkpoint_every == 0:
        raise ConfigError("--checkpoint-every 0 saves only at exit: a server restarted after "
                          "a crash would have no checkpoint the workers can replay from; give "
                          "an interval (or --max-restarts 0)")
    if checkpoint_every + REPLAY_SLACK > replay_rounds:
        raise ConfigError(f"--checkpoint-every {checkpoint_every} needs --replay-rounds of at "
                          f"least {checkpoint_every + REPLAY_SLACK} (got {replay_rounds}): a "
                          "server restarted from its last checkpoint would miss rounds no "
                          "worker can replay; lower the one or raise the other (or "
                          "--max-restarts 0)")

@dataclass(frozen=True)
class ServerOptions:
    """The settings of one ``ps-server`` process."""

    shard: int = setting(0, "This node's shard index s (0..S-1).", roles=(SERVER,), minimum=0,
                         required=True)
    bind: str = setting("tcp://127.0.0.1:5550", "ZeroMQ endpoint to bind (tcp://HOST:* for a "
                        "free port; see --ready-file).", roles=(SERVER,))
    linger_s: float = setting(30.0, "After the last round, keep serving this long (seconds) "
                              "while an evaluator has not read the final parameters.",
                              flag="--linger", roles=(SERVER,), minimum=0.0)
    checkpoint_every: int = setting(CHECKPOINT_EVERY, "Save the shard (shard-<s>.npz in "
                                    "--out-dir, atomically and durably) every K rounds; 0: only "
                                    "at exit. It is always saved at exit and on SIGTERM. A "
                                    "server resumed from it gets the rounds after it replayed "
                                    "by the workers, so keep K below their --replay-rounds.",
                                    roles=(SERVER, CLUSTER), minimum=0)
    resume: bool = setting(False, "Continue from the checkpoint in --out-dir, if any (workers "
                           "re-push what the restarted server lost).", roles=(SERVER,))
    round_timeout_s: float | None = setting(
        None, "Close a round this many seconds after its first push with the pushes that "
        "are in, if at least --quorum (default: wait for all n, the paper's synchronous "
        "SGD).", flag="--round-timeout", roles=(SERVER, CLUSTER), minimum=0.001)
    quorum: int | None = setting(
        None, "Pushes a round needs to close at its deadline (default n; at least n - q, "
        "and enough rows for the rule).", roles=(SERVER, CLUSTER), minimum=1)

    def rows_needed(self, cfg: RunConfig) -> int:
        """The quorum K: pushes a round needs to close at its deadline (n without one)."""
        if self.round_timeout_s is None or self.quorum is None:
            return cfg.num_workers
        return self.quorum

    def check(self, cfg: RunConfig) -> ServerOptions:
        """``ConfigError`` for a quorum the run cannot use, naming both numbers."""
        n, q = cfg.num_workers, cfg.q
        if self.quorum is None:
            return self
        if self.round_timeout_s is None:
            raise ConfigError(f"--quorum {self.quorum} needs --round-timeout (without a "
                              f"deadline every round waits for all n={n} pushes)")
        if not n - q <= self.quorum <= n:
            raise ConfigError(f"--quorum {self.quorum} must be in n - q..n = {n - q}..{n} "
                              f"(n={n} workers, q={q} Byzantine)")
        try:
            cfg.check_rows(self.quorum)  # the --pre chain, then the rule
        except RuleError as exc:
            raise ConfigError(f"--quorum {self.quorum}: rule {cfg.rule} cannot aggregate "
                              f"{self.quorum} rows with q={q}: {exc}") from exc
        return self
