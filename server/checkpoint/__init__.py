"""Authenticated, atomic checkpoints of one shard: its parameters, the round they belong
to, the round before's, and the state a stateful rule carries between rounds (centered
clipping's previous aggregate, saved as ``rule_<name>``).

One module per job: ``format.py`` (the file's layout, :class:`Checkpoint`,
:class:`Expected`, :class:`CheckpointError`), ``seal.py`` (the MAC key, the tag),
``writer.py`` (atomic durable writes, the :class:`CheckpointWriter` thread),
``reader.py`` (:func:`load_checkpoint`), ``run.py`` (a run's checkpoints: the
launcher's and the final parameters' readers) and ``group.py`` (a process of several
shards: their files, the generation before, the round they share to resume from).

A file is a header line naming the format and the kind of tag, a fixed table (shard,
round, configuration hash, each array's name and size), the tag, then the raw float32
arrays. With keys the tag is HMAC-SHA256 under a key derived from the server's CURVE
secret, so a server resumes only a file it wrote; with ``--insecure`` it is a SHA-256
that detects corruption, not forgery. Every refusal is one line naming the file and
the reason, a ``ConfigError`` (exit 2): a supervisor does not restart a server that
refused its checkpoint (no crash loop).

What the MAC cannot do: it does not stop an insider who can delete the file (the server
then starts at round 0) or put back an *older* checkpoint of the same server and run
(a rollback: within the workers' ``--replay-rounds`` they replay it as after a crash,
with the same result; beyond it they stop with a peer error). A proxy test tool holds
its own key only, nothing from which a server's MAC key derives.
"""

from server.checkpoint.format import Checkpoint, CheckpointError, Expected
from server.checkpoint.group import GroupFiles, previous_path
from server.checkpoint.reader import load_checkpoint
from server.checkpoint.run import (
    checkpoint_path,
    expected_checkpoint,
    final_parameters,
    model_size,
    params_digest,
    process_of,
    read_run_checkpoint,
)
from server.checkpoint.seal import checkpoint_mac_key, server_mac_key
from server.checkpoint.writer import CheckpointWriter, encode_checkpoint, save_checkpoint

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointWriter",
    "Expected",
    "GroupFiles",
    "checkpoint_mac_key",
    "checkpoint_path",
    "encode_checkpoint",
    "expected_checkpoint",
    "final_parameters",
    "load_checkpoint",
    "model_size",
    "params_digest",
    "previous_path",
    "process_of",
    "read_run_checkpoint",
    "save_checkpoint",
    "server_mac_key",
]
