"""The proxy's ZeroMQ loop: a ROUTER front where the workers expect the server, a
DEALER back to the real server, and the core (``ps/proxy/core.py``) in between.

Requests travel front -> back with the worker's identity prepended (the server treats
that envelope as opaque and echoes it); replies travel back -> front routed by it.
"""

from __future__ import annotations

import logging
import time

import zmq

from common.config import AttackConfig, RunConfig
from common.errors import ClusterTimeout, ConfigError
from common.keys import KeyRing
from common.metrics import JsonlWriter
from common.process import ProcessOptions, check_stop, freeze_startup_objects
from common.protocol import Hello, Welcome, encode
from common.transport import (
    LINGER_MS,
    Listener,
    connect_dealer,
    largest_message,
    receive,
    send_frames,
    shut_down,
    write_ready_file,
)
from ps.proxy.core import ProxyCore
from ps.proxy.options import ProxyOptions

log = logging.getLogger("ps.proxy")

POLL_MS = 200
HANDSHAKE_RETRY_S = 1.0


def handshake(back: zmq.Socket, cfg: RunConfig, options: ProxyOptions) -> Welcome:
    """HELLO the server (as role 'proxy') until it answers; learn the shard's range."""
    hello = encode(Hello(role="proxy", worker=-1, config_hash=cfg.config_hash,
                         config=cfg.to_dict()))
    deadline = time.monotonic() + options.connect_timeout_s
    while True:
        check_stop()
        back.send_multipart([b"", *hello])
        if back.poll(int(HANDSHAKE_RETRY_S * 1000), zmq.POLLIN):
            reply = receive(back)
            if reply.message is None:
                raise ConfigError(f"server {options.server} answered garbage: {reply.error}")
            if isinstance(reply.message.header, Welcome):
                return reply.message.header
            raise ConfigError(
                f"server {options.server} refused the proxy: {reply.message.header}")
        if time.monotonic() > deadline:
            raise ClusterTimeout(f"server {options.server} did not answer within "
                                 f"{options.connect_timeout_s:g} s")


def relay(cfg: RunConfig, attack: AttackConfig, options: ProxyOptions,
          process: ProcessOptions, keys: KeyRing | None) -> None:
    """Relay until stopped, or until the n ACKs of the last round went back.

    With ``keys`` the proxy connects with the key ``proxy-<s>`` (which the server of shard
    s, and no other, trusts to relay) and presents the server's own key to the workers,
    admitting the workers' keys only: a man in the middle works only because the test
    handed it both.
    """
    ctx = zmq.Context.instance()
    shard = options.shard
    back = connect_dealer(ctx, options.server,
                          curve=keys.client_curve(f"proxy-{shard}", shard) if keys else None)
    front = None
    try:
        welcome = handshake(back, cfg, options)
        out = process.out_dir
        metrics = JsonlWriter(out / f"proxy-{welcome.shard}.jsonl" if out else None)
        if shard is not None and welcome.shard != shard:
            raise ConfigError(f"{options.server} serves shard {welcome.shard}, not --shard {shard}")
        largest = largest_message(welcome.stop - welcome.start)
        front_curve = keys.front_curve(welcome.shard, cfg.num_workers) if keys else None
        front = Listener(ctx, options.bind, front_curve, largest)
        core = ProxyCore(cfg, attack, welcome, metrics, on_bar=front.bar)
        log.info("fronting shard %d [%d, %d) at %s -> %s with attack %s", welcome.shard,
                 welcome.start, welcome.stop, front.endpoint, options.server,
                 attack.proxy_attack)
        write_ready_file(process.ready_file, front.endpoint)
        freeze_startup_objects()
        poller = zmq.Poller()
        poller.register(front.sock, zmq.POLLIN)
        poller.register(back, zmq.POLLIN)
        try:
            while not core.done(time.monotonic()):
                check_stop()
                events = dict(poller.poll(POLL_MS))
                outgoing = []
                if front.sock in events:
                    outgoing += core.from_worker(front.receive(), time.monotonic())
                if back in events:
                    outgoing += core.from_server(receive(back, largest), time.monotonic())
                for identity, why in front.offences():
                    core.offence(identity, why, time.monotonic())
                for o in outgoing:
                    send_frames(back if o.to_server else front.sock, o.frames)
            log.info("the last round's replies went back; exiting")
        finally:
            metrics.close()
    finally:
        if front is not None:
            front.close()
        back.close(linger=LINGER_MS)
        shut_down(ctx)
