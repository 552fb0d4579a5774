"""Where a proxy listens and which server it fronts."""

from __future__ import annotations

from dataclasses import dataclass

from common.conf.settings import PROXY, setting


@dataclass(frozen=True)
class ProxyOptions:
    """The settings of one ``ps-proxy`` process."""

    bind: str = setting("tcp://127.0.0.1:5650", "Endpoint to bind where the workers expect the "
                        "server (tcp://HOST:* for any port).", env="PS_PROXY_BIND",
                        roles=(PROXY,))
    server: str | None = setting(None, "Endpoint of the real server this proxy fronts.",
                          env="PS_PROXY_SERVER", roles=(PROXY,), required=True)
    shard: str | None = setting(None, "The shards of the server process this proxy fronts "
                                "(as its --shard: 3, 0-4, 1,3); with --keys they pick the "
                                "keys (its own, proxy-<first>, which it presents to the "
                                "workers, and server-<first>'s public key). It corrupts those of "
                                "them in --proxy-shards (default: all).", flag="--shard",
                                env="PS_PROXY_SHARD", roles=(PROXY,))
    connect_timeout_s: float = setting(120.0, "Seconds to wait for the server to answer the "
                                       "proxy's handshake.", flag="--connect-timeout",
                                       roles=(PROXY,), minimum=0.001)
