"""How one server node runs (everything but the shared run configuration)."""

from __future__ import annotations

from dataclasses import dataclass

from common.settings import CLUSTER, SERVER, setting


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
    checkpoint_every: int = setting(1, "Save the shard (shard-<s>.npz in --out-dir, "
                                    "atomically) every K rounds; 0: only at exit. It is always "
                                    "saved at exit and on SIGTERM.", roles=(SERVER, CLUSTER),
                                    minimum=0)
    resume: bool = setting(False, "Continue from the checkpoint in --out-dir, if any (workers "
                           "re-push what the restarted server lost).", roles=(SERVER,))
