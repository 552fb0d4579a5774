"""How long a worker keeps its pushes, and how often a server saves its shards.

A server restarted after a crash resumes from its last checkpoint, and the workers
replay the rounds after it from the pushes they kept (``--replay-rounds``): so the
checkpoint interval (``--checkpoint-every``) must leave the replay window room. Both
default by the model's size d: the paper's models keep 18 rounds and save every 8, as
always, while a large model keeps at most about ``REPLAY_BUDGET_BYTES`` of pushes per
worker and is saved more often to match. At d = 10.6M (``--model wide``) 18 rounds are
760 MB a worker, 15 GB for 20 workers on one host, and every one of them a vector the
worker allocated in the run's first 18 rounds; 6 rounds and a save every 2 rounds
measured 0.80 rounds/s against 0.41 with 18 and 8 (n = 20, S = 4, no keys, this 2-core
machine; ``scripts/bench_cluster.py --d-models wide``).
"""

from __future__ import annotations

REPLAY_ROUNDS = 18  # the window of the paper's models
CHECKPOINT_EVERY = 8  # their checkpoint interval
# Rounds of the replay window a checkpoint interval must leave free: the checkpoint
# handed to the writer thread when the server dies may not be on disk yet, and one write
# may have failed.
REPLAY_SLACK = 2
# A process of several shards may resume from the checkpoint before its last
# (``server.checkpoint.GroupFiles``): the default interval leaves room for two.
GENERATIONS = 2
MIN_REPLAY_ROUNDS = GENERATIONS + REPLAY_SLACK
REPLAY_BUDGET_BYTES = 256 << 20  # a worker's kept pushes, by default, at most about


def default_replay_rounds(d: int) -> int:
    """The rounds a worker keeps by default for a model of ``d`` float32 values: 18, fewer
    for a large model (about ``REPLAY_BUDGET_BYTES``), at least ``MIN_REPLAY_ROUNDS``."""
    return max(MIN_REPLAY_ROUNDS, min(REPLAY_ROUNDS, REPLAY_BUDGET_BYTES // (4 * max(d, 1))))


def default_checkpoint_every(d: int) -> int:
    """The checkpoint interval by default for a model of ``d`` values: the largest that
    the default replay window covers twice (8 for the paper's models)."""
    return max(1, (default_replay_rounds(d) - REPLAY_SLACK) // GENERATIONS)
