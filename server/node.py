"""The server node's ZeroMQ loop: receive, let the core decide, send its replies.

Everything a node decides lives in ``server/core.py``; this loop only moves messages
between the ROUTER socket (``common/net/transport.py``) and the core, and stops when the
core is done or a stop was requested (then the shards are checkpointed on the way out).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import zmq

from common.errors import ConfigError
from common.net.keys import KeyRing
from common.net.transport import (
    REPLIES_HELD,
    Listener,
    ReplyLedger,
    largest_message,
    node_context,
    shut_down,
    write_ready_file,
)
from common.net.wire import ITEM_BYTES as WIRE_ITEM_BYTES
from common.run.config import RunConfig
from common.run.metrics import JsonlWriter
from common.run.process import ProcessOptions, check_stop, freeze_startup_objects
from server.checkpoint import (
    CheckpointError,
    CheckpointWriter,
    GroupFiles,
    checkpoint_path,
    expected_checkpoint,
    server_mac_key,
)
from server.core import CHECKPOINT_FAILED, RestoreError, ServerCore
from server.options import ServerOptions
from server.sessions import RelayTags

log = logging.getLogger("ps.server")

POLL_MS = 200
MAX_BATCH = 1000  # messages handled between two looks at the clock


def build_core(cfg: RunConfig, options: ServerOptions, out_dir: Path | None,
               initial: np.ndarray, mac_keys: Mapping[int, bytes | None] | None = None,
               ) -> tuple[ServerCore, CheckpointWriter | None]:
    """The core with its shards' metrics files and checkpoint writer in ``out_dir``,
    resumed from the checkpoints there if ``options.resume`` and there are some.

    ``mac_keys`` (each hosted shard's ``server.checkpoint.server_mac_key``; None with
    ``--insecure``: unkeyed digests) tag every checkpoint written, and the ones resumed
    must carry them; a checkpoint refused for any reason is a ``CheckpointError`` (exit
    2) naming the file, and the file is left as it was. A process of several shards
    resumes at the newest round all of them have (``server.checkpoint.GroupFiles``)."""
    shards = options.shards(cfg)
    keys = {s: (mac_keys or {}).get(s) for s in shards}
    metrics = {s: JsonlWriter(out_dir / f"server-{s}.jsonl" if out_dir else None)
               for s in shards}
    files = GroupFiles(out_dir, shards, keys) if out_dir else None
    writer = (CheckpointWriter(files, lambda: core.counters.update([CHECKPOINT_FAILED]))
              if files else None)
    core = ServerCore(cfg, options, initial, metrics, save=writer.submit if writer else None)
    if files is not None and not options.resume:
        files.discard_previous()  # another run's: never to be resumed
    if options.resume:
        if files is None:
            raise ConfigError("--resume needs --out-dir (where the checkpoint is)")
        # the names of its rule's state arrays: none for a stateless rule (None: any)
        rule_state: frozenset[str] | None = (None if core.state.states[0].defence.stateful
                                             else frozenset())
        expect = {s: expected_checkpoint(cfg, s, finite=True, d=initial.size,
                                         rule_state=rule_state) for s in shards}
        ckpts = files.load(expect)
        if ckpts is not None:
            try:
                core.restore(ckpts)
            except RestoreError as exc:
                raise CheckpointError(checkpoint_path(files.out_dir, exc.shard),
                                      str(exc)) from exc
            log.info("resumed shards %s from %s at round %d", core.name, out_dir,
                     core.state.round)
        else:
            log.info("no checkpoint of shards %s in %s; starting from round 0", core.name,
                     out_dir)
    return core, writer


def serve(cfg: RunConfig, options: ServerOptions, process: ProcessOptions,
          initial: np.ndarray, keys: KeyRing | None) -> None:
    """Serve until the last round is done (plus linger) or a stop is requested; with
    ``keys`` as a CURVE server that admits only the client keys whose scope includes the
    shard, within their budgets (``common/net/admission.py``)."""
    shards = options.shards(cfg)
    first = shards[0]  # the process's name: its key is server-<first>
    mac_keys = {s: server_mac_key(keys, s, first) for s in shards}
    core, writer = build_core(cfg, options, process.out_dir, initial, mac_keys)
    curve = keys.server_curve(first, cfg.num_workers) if keys else None
    if keys is not None:
        core.relay = RelayTags(cfg.config_hash, first,
                               functools.partial(keys.server_relay_key, first))
    ctx = node_context(curve is not None)
    largest = largest_message(core.state.size, WIRE_ITEM_BYTES[cfg.wire_dtype])  # a push
    listener = Listener(ctx, options.bind, curve, largest,
                        peers_per_connection=cfg.num_workers, clients=cfg.num_workers)
    core.peers.on_bar = listener.bar
    # the large replies a key has not taken (each pins its round's values): a few each
    listener.ledger = ReplyLedger(core.reply_principal, REPLIES_HELD * largest_message(
        core.state.size), core.unread_reply)
    sock = listener.sock
    try:
        log.info("shards %s of %d (%d values of d=%d) listening on %s (rule %s, n=%d, q=%d, "
                 "%d rounds, %s)", core.name, cfg.num_shards, core.state.size, core.d,
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
                    listener.send_all(core.handle(listener.receive(), time.monotonic()))
            for identity, why in listener.offences():
                core.offence(identity, why, time.monotonic())
            listener.send_all(core.tick(time.monotonic()))
        log.info("run finished after %d rounds; exiting", cfg.rounds)
    finally:
        if writer is not None:
            writer.close(core.snapshot())
        for metrics in core.metrics.values():
            metrics.close()
        listener.close()
        shut_down(ctx)


def _poll_ms(core: ServerCore, now: float) -> int:
    """How long to wait for a message: ``POLL_MS``, less if the round's deadline is nearer."""
    deadline = core.deadline()
    if deadline is None or deadline <= now:  # past it, pushes (or ticks) close the round
        return POLL_MS
    return max(1, min(POLL_MS, int((deadline - now) * 1000) + 1))
