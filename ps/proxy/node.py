"""The proxy's ZeroMQ loop: a ROUTER front where the workers expect the server, a
DEALER back to the real server, and the core (``ps/proxy/core.py``) in between.

Requests travel front -> back with the worker's identity prepended (the server treats
that envelope as opaque and echoes it); replies travel back -> front routed by it.
"""

from __future__ import annotations

import logging
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from common.errors import ClusterTimeout, ConfigError
from common.net.keys import KeyRing
from common.net.protocol import Hello, Welcome, encode, split_envelope
from common.net.sharding import format_shard_set, parse_shard_set
from common.net.transport import (
    LINGER_MS,
    RELAY_HOP_BYTES,
    REPLIES_HELD,
    Listener,
    ReplyLedger,
    connect_dealer,
    large_bytes,
    largest_message,
    node_context,
    receive,
    send_frames,
    shut_down,
    write_ready_file,
)
from common.net.wire import ITEM_BYTES as WIRE_ITEM_BYTES
from common.run.config import AttackConfig, RunConfig
from common.run.metrics import JsonlWriter
from common.run.process import ProcessOptions, check_stop, freeze_startup_objects
from ps.proxy.core import ProxyCore
from ps.proxy.options import ProxyOptions

log = logging.getLogger("ps.proxy")

POLL_MS = 200
HANDSHAKE_RETRY_S = 1.0


def handshake(back: zmq.Socket, cfg: RunConfig, options: ProxyOptions) -> Welcome:
    """HELLO the server (as role 'proxy') until it answers; learn its shards."""
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
          process: ProcessOptions, keys: KeyRing | None,
          targets: tuple[int, ...] | None = None) -> None:
    """Relay until stopped, or until the last round's ACKs went back (``ProxyCore.done``),
    corrupting the server's shards in ``targets`` (None: all it hosts).

    With ``keys`` the proxy connects with the key ``proxy-<first>`` (which the server
    process named by its first shard, and no other, trusts to relay) and presents the
    server's own key to the workers, admitting the workers' keys only: a man in the
    middle works only because the test handed it both.
    """
    if options.server is None:  # (required: the command does not start without it)
        raise ConfigError("ps-proxy needs --server")
    expected = parse_shard_set(options.shard, cfg.num_shards) if options.shard else None
    first = expected[0] if expected else None
    if keys is not None and first is None:  # (as the command checks)
        raise ConfigError("ps-proxy with --keys needs --shard (whose keys to use)")
    ctx = node_context(keys is not None)
    back = connect_dealer(ctx, options.server,
                          curve=keys.client_curve(f"proxy-{first}", first)
                          if keys is not None and first is not None else None)
    front = None
    try:
        welcome = handshake(back, cfg, options)
        try:  # the server's word, checked before anything is built from it
            hosted = parse_shard_set(",".join(map(str, welcome.shards)), cfg.num_shards)
            if list(hosted) != list(welcome.shards):
                raise ConfigError("not in ascending order")
        except ConfigError as exc:
            raise ConfigError(f"{options.server} answered shards {welcome.shards}: {exc}") from None
        if expected is not None and hosted != expected:
            raise ConfigError(f"{options.server} serves shards {format_shard_set(hosted)}, "
                              f"not --shard {options.shard}")
        if targets is None and len(hosted) > 1:
            raise ConfigError(f"{options.server} hosts shards {format_shard_set(hosted)}: name "
                              f"the ones this proxy corrupts with --proxy-shards (the "
                              f"launchers and the reference engine default to shard 0)")
        if targets is not None and not set(targets) & set(hosted):
            raise ConfigError(f"{options.server} hosts shards {format_shard_set(hosted)}, "
                              f"none of --proxy-shards {format_shard_set(targets)}")
        out = process.out_dir
        metrics = JsonlWriter(out / f"proxy-{hosted[0]}.jsonl" if out else None)
        largest = largest_message(welcome.length)  # a PARAMS reply, float32
        front_curve = keys.front_curve(hosted[0], cfg.num_workers) if keys else None
        # a worker's push, in the run's --wire-dtype, less the hop to the server: what is
        # relayed as it came stays legal there, where the proxy's routing id is added (a
        # message padded to the limit here must not get the proxy's own key barred)
        front = Listener(ctx, options.bind, front_curve,
                         largest_message(welcome.length, WIRE_ITEM_BYTES[cfg.wire_dtype])
                         - RELAY_HOP_BYTES, clients=cfg.num_workers)
        core = ProxyCore(cfg, attack, welcome, metrics, on_bar=front.bar, targets=targets)
        # the large replies a worker's connection has not taken (a key has at most 4)
        ledger = ReplyLedger(lambda envelope: bytes(envelope[0]) if envelope else None,
                             REPLIES_HELD * largest, core.unread_reply)
        log.info("fronting shards %s (corrupting %s) at %s -> %s with attack %s",
                 core.name, format_shard_set(core.targets), front.endpoint, options.server,
                 attack.proxy_attack)
        write_ready_file(process.ready_file, front.endpoint)
        freeze_startup_objects()
        # whether the server is there: once it finished its last round it exits
        link = back.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        poller = zmq.Poller()
        poller.register(front.sock, zmq.POLLIN)
        poller.register(back, zmq.POLLIN)
        poller.register(link, zmq.POLLIN)
        try:
            while not core.done(time.monotonic()):
                check_stop()
                events = dict(poller.poll(POLL_MS))
                while link.poll(0):
                    event = recv_monitor_message(link)["event"]
                    core.server_link(event == zmq.EVENT_CONNECTED, time.monotonic())
                outgoing = []
                if front.sock in events:
                    outgoing += core.from_worker(front.receive(), time.monotonic())
                if back in events:
                    outgoing += core.from_server(receive(back, largest), time.monotonic())
                for identity, why in front.offences():
                    core.offence(identity, why, time.monotonic())
                for o in outgoing:
                    if o.to_server:
                        send_frames(back, o.frames)
                        continue
                    envelope, body = split_envelope(o.frames)
                    large = large_bytes(body)
                    if large:  # values from the server or corrupted: pinned until sent
                        ledger.send(front.sock, envelope, body, large)
                    else:
                        send_frames(front.sock, o.frames)
            log.info("the run is over for this proxy (%s); exiting",
                     "the last round's ACKs went back" if core.server_gone is None
                     else "its server left in the last round")
        finally:
            back.disable_monitor()
            link.close(linger=0)
            metrics.close()
    finally:
        if front is not None:
            front.close()
        back.close(linger=LINGER_MS)
        shut_down(ctx)
