"""How one server process runs (everything but the shared run configuration)."""

from __future__ import annotations

from dataclasses import dataclass

from common.conf.settings import CLUSTER, SERVER, setting
from common.errors import ConfigError
from common.learn.rules import RuleError
from common.learn.rules.defence import validated_q
from common.net.sharding import ShardSet, parse_shard_set
from common.run.config import RunConfig
from common.run.replay import REPLAY_SLACK, default_checkpoint_every
from server.deadline import AUTO, RoundDeadline

# By default every 8 rounds for the paper's models (``common/run/replay.py``: fewer for a large
# model): a checkpoint (a file written and fsynced, its directory fsynced) costs about 1.4
# ms of CPU per server and round here, 28 ms a round with 20 servers; the workers keep the
# last 18 rounds' pushes (--replay-rounds) for a server resumed from it, or from the one
# before (a process of several shards killed between its shards' files).


def check_replayable(checkpoint_every: int, replay_rounds: int, generations: int = 1) -> None:
    """``ConfigError`` unless a server restarted from its last checkpoint (``--resume``)
    gets every round after it replayed by the workers, who keep ``replay_rounds``;
    ``generations`` 2 for a process of several shards, which may resume from the
    checkpoint before its last (``server.checkpoint.GroupFiles``)."""
    if checkpoint_every == 0:
        raise ConfigError("--checkpoint-every 0 saves only at exit: a server restarted after "
                          "a crash would have no checkpoint the workers can replay from; give "
                          "an interval (or --max-restarts 0)")
    needed = generations * checkpoint_every + REPLAY_SLACK
    if needed > replay_rounds:
        several = (" (a server process of several shards may resume from the checkpoint "
                   "before its last)" if generations > 1 else "")
        raise ConfigError(f"--checkpoint-every {checkpoint_every} needs --replay-rounds of at "
                          f"least {needed} (got {replay_rounds}): a server restarted from its "
                          f"last checkpoint{several} would miss rounds no worker can replay; "
                          "lower the one or raise the other (or --max-restarts 0)")

@dataclass(frozen=True)
class ServerOptions:
    """The settings of one ``ps-server`` process."""

    shard: str = setting("0", "The shards this process hosts: an index s (0..S-1), a range "
                         "a-b or a list (0-4, 1,3). A worker pushes it one message carrying "
                         "all of them; each is aggregated, saved and measured as its own.",
                         roles=(SERVER,), required=True)
    bind: str = setting("tcp://127.0.0.1:5550", "ZeroMQ endpoint to bind (tcp://HOST:* for a "
                        "free port; see --ready-file).", roles=(SERVER,))
    linger_s: float = setting(30.0, "After the last round, keep serving this long (seconds) "
                              "while an evaluator has not read the final parameters.",
                              flag="--linger", roles=(SERVER,), minimum=0.0)
    await_evaluator: bool = setting(
        False, "An evaluator will read the parameters: round 0 stays open until it has "
        "said HELLO, and after the last round the server lingers for it even before its "
        "HELLO (each wait at most --linger), so it reads the first and the final round "
        "however late it starts. ps-cluster and the generated deployments set it when they "
        "start one.",
        roles=(SERVER,))
    checkpoint_every: int | None = setting(
        None, "Save each shard (shard-<s>.npz in --out-dir, atomically and durably; a "
        "process of several shards keeps the one before too, shard-<s>.prev.npz) every K "
        "rounds; 0: only at exit. It is always saved at exit and on SIGTERM. A server "
        "resumed from it gets the rounds after it replayed by the workers, so keep K below "
        "their --replay-rounds (half of it for several shards). Default: 8, fewer for a "
        "model whose default replay window is shorter (2 at 10M parameters).",
        roles=(SERVER, CLUSTER), minimum=0)
    resume: bool = setting(False, "Continue from the checkpoint in --out-dir, if any (workers "
                           "re-push what the restarted server lost).", roles=(SERVER,))
    round_timeout: str = setting(
        AUTO, "How long a round waits for missing pushes after its (q+1)-th push (the first "
        "the q Byzantine workers cannot send alone), then closes "
        "with those in if at least --quorum: auto (the default: 10 times the median of "
        "recent rounds ((q+1)-th push to the (n-q)-th), at least 5 s, at most 600 s; 30 s "
        "after the (q+1)-th push or a worker's first HELLO until a round reached n - q; a "
        "healthy run does not "
        "reach it, a worker that stops answering costs one deadline), SECONDS, or none "
        "(wait for all n, the paper's strictly synchronous SGD).",
        flag="--round-timeout", roles=(SERVER, CLUSTER))
    quorum: int | None = setting(
        None, "Pushes a round needs to close at its deadline (default: n - q, or the "
        "fewest above it that the rule can aggregate; at least n - q).",
        roles=(SERVER, CLUSTER), minimum=1)

    def checkpoint_interval(self, d: int) -> int:
        """``--checkpoint-every``, or its default for a model of ``d`` values."""
        if self.checkpoint_every is not None:
            return self.checkpoint_every
        return default_checkpoint_every(d)

    def shards(self, cfg: RunConfig) -> ShardSet:
        """The hosted shards, ascending (``ConfigError`` naming --shard if not 0..S-1)."""
        try:
            return parse_shard_set(self.shard, cfg.num_shards)
        except ConfigError as exc:
            raise ConfigError(f"--shard: {exc}") from None

    def deadline(self) -> RoundDeadline | None:
        """The round deadline of ``--round-timeout`` (None: wait for all n);
        ``ConfigError`` for an unreadable value."""
        return RoundDeadline.parse(self.round_timeout)

    def rows_needed(self, cfg: RunConfig) -> int:
        """The quorum K: pushes a round needs to close at its deadline (n without one)."""
        if self.deadline() is None:
            return cfg.num_workers
        if self.quorum is not None:
            return self.quorum
        return default_quorum(cfg)

    def check(self, cfg: RunConfig) -> ServerOptions:
        """``ConfigError`` for shards outside the run, an unreadable deadline or a quorum
        the run cannot use, naming both numbers."""
        self.shards(cfg)
        n = cfg.num_workers
        deadline = self.deadline()
        if self.quorum is None:
            return self
        if deadline is None:
            raise ConfigError(f"--quorum {self.quorum} needs a round deadline (with "
                              f"--round-timeout none every round waits for all n={n} pushes)")
        q = validated_q(cfg)
        if not n - q <= self.quorum <= n:
            raise ConfigError(f"--quorum {self.quorum} must be in n - q..n = {n - q}..{n} "
                              f"(n={n} workers, q={q} Byzantine)")
        try:
            cfg.check_rows(self.quorum)  # the --pre chain, then the rule
        except RuleError as exc:
            raise ConfigError(f"--quorum {self.quorum}: rule {cfg.rule} cannot aggregate "
                              f"{self.quorum} rows with q={q}: {exc}") from exc
        return self


def default_quorum(cfg: RunConfig) -> int:
    """n - q, or the fewest rows above it that the --pre chain and the rule can
    aggregate at this q (n always can: the run's settings were validated for it)."""
    n = cfg.num_workers
    for rows in range(max(1, n - validated_q(cfg)), n):
        try:
            cfg.check_rows(rows)
        except RuleError:
            continue
        return rows
    return n
