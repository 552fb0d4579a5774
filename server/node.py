"""The server node's ZeroMQ loop: receive, let the core decide, send its replies.

Everything a node decides lives in ``server/core.py``; this loop only moves messages
between the ROUTER socket (``common/transport.py``) and the core, and stops when the
core is done or a stop was requested (then the shard is checkpointed on the way out).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np
import zmq

from common.config import RunConfig
from common.errors import ConfigError
from common.keys import KeyRing
from common.metrics import JsonlWriter
from common.process import ProcessOptions, check_stop, freeze_startup_objects
from common.transport import Listener, largest_message, shut_down, write_ready_file
from server.checkpoint import (
    CheckpointError,
    CheckpointWriter,
    Expected,
    checkpoint_path,
    load_checkpoint,
    server_mac_key,
)
from server.core import CHECKPOINT_FAILED, ServerCore
from server.options import ServerOptions

log = logging.getLogger("ps.server")

POLL_MS = 200
MAX_BATCH = 1000  # messages handled between two looks at the clock


def build_core(cfg: RunConfig, options: ServerOptions, out_dir: Path | None,
               initial: np.ndarray, mac_key: bytes | None = None,
               ) -> tuple[ServerCore, CheckpointWriter | None]:
    """The core with its metrics file and checkpoint writer in ``out_dir``, resumed from
    the checkpoint there if ``options.resume`` and one exists.

    ``mac_key`` (``server.checkpoint.server_mac_key(keys, shard)``; None with
    ``--insecure``: unkeyed digests) tags every checkpoint written, and the one resumed
    must carry it; a checkpoint refused for any reason is a ``CheckpointError`` (exit 2)
    naming the file, and the file is left as it was."""
    shard = options.shard
    metrics = JsonlWriter(out_dir / f"server-{shard}.jsonl" if out_dir else None)
    path = checkpoint_path(out_dir, shard) if out_dir else None
    writer = (CheckpointWriter(path, on_failure=lambda: core.counters.update([CHECKPOINT_FAILED]),
                               key=mac_key)
              if path else None)
    core = ServerCore(cfg, options, initial, metrics, save=writer.submit if writer else None)
    if options.resume:
        if path is None:
            raise ConfigError("--resume needs --out-dir (where the checkpoint is)")
        if os.path.lexists(path):
            expect = Expected.of(cfg, shard, size=core.stop - core.start,
                                 rule_state=None if core.state.defence.stateful
                                 else frozenset())
            ckpt = load_checkpoint(path, key=mac_key, expect=expect)
            try:
                core.restore(ckpt)
            except ConfigError as exc:
                raise CheckpointError(path, str(exc)) from exc
            log.info("resumed from %s at round %d", path, core.state.round)
        else:
            log.info("no checkpoint at %s; starting from round 0", path)
    return core, writer


def serve(cfg: RunConfig, options: ServerOptions, process: ProcessOptions,
          initial: np.ndarray, keys: KeyRing | None) -> None:
    """Serve until the last round is done (plus linger) or a stop is requested; with
    ``keys`` as a CURVE server that admits only the client keys whose scope includes the
    shard, within their budgets (``common/admission.py``)."""
    mac_key = server_mac_key(keys, options.shard)
    core, writer = build_core(cfg, options, process.out_dir, initial, mac_key)
    curve = keys.server_curve(options.shard, cfg.num_workers) if keys else None
    ctx = zmq.Context.instance()
    listener = Listener(ctx, options.bind, curve, largest_message(core.stop - core.start),
                        peers_per_connection=cfg.num_workers)
    core.peers.on_bar = listener.bar
    sock = listener.sock
    try:
        log.info("shard %d/%d [%d, %d) of d=%d listening on %s (rule %s, n=%d, q=%d, "
                 "%d rounds, %s)", options.shard, cfg.num_shards, core.start, core.stop, core.d,
                 listener.endpoint, cfg.rule, cfg.num_workers, cfg.q, cfg.rounds,
                 "CURVE keys" if curve else "INSECURE: no keys")
        write_ready_file(process.ready_file, listener.endpoint)
        freeze_startup_objects()
        while not core.done(time.monotonic()):
            check_stop()
            if sock.poll(_poll_ms(core, time.monotonic()), zmq.POLLIN):
                # drain what is queued (a bounded batch: a flood cannot hold off the
                # deadline, the offences or a stop) before checking the clock again
                for _ in range(MAX_BATCH):
                    if not sock.poll(0, zmq.POLLIN):
                        break
                    for reply in core.handle(listener.receive(), time.monotonic()):
                        listener.send(reply.envelope, reply.header, reply.tensor)
            for identity, why in listener.offences():
                core.offence(identity, why, time.monotonic())
            for reply in core.tick(time.monotonic()):
                listener.send(reply.envelope, reply.header, reply.tensor)
        log.info("run finished after %d rounds; exiting", cfg.rounds)
    finally:
        if writer is not None:
            writer.close(core.snapshot())
        core.metrics.close()
        listener.close()
        shut_down(ctx)


def _poll_ms(core: ServerCore, now: float) -> int:
    """How long to wait for a message: ``POLL_MS``, less if the round's deadline is nearer."""
    deadline = core.deadline()
    if deadline is None or deadline <= now:  # past it, pushes (or ticks) close the round
        return POLL_MS
    return max(1, min(POLL_MS, int((deadline - now) * 1000) + 1))
