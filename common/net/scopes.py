"""What each key may say, wherever it is checked: the scope of a CURVE key's messages.

A worker's key speaks only as its own worker; the evaluator's key reads; a proxy's key,
only at the server process it fronts, says HELLO as itself and relays workers' messages.
The servers check every message against it (``server/core.py``), and so does a proxy
for what reaches it from the workers (``ps/proxy/core.py``), each with its own
envelope depth. The end-to-end tags of relayed messages are a server's check
(``server.sessions.RelayTags``).
"""

from __future__ import annotations

from common.net.keys import Identity
from common.net.protocol import ErrorCode, Header, Hello, Pull, Push, Refused, Status


def check_claim(identity: Identity | None, header: Header, depth: int = 1,
                server: int | None = None) -> None:
    """Refuse (FORBIDDEN) what the key ``identity`` may not send at server process
    ``server`` (named by its first shard; None: no keys in use). ``depth``: frames of
    the message's routing envelope
    (1 from a direct connection, 2 relayed by a proxy).

    * a worker key may HELLO and PUSH only as its own worker id, and PULL and ask STATUS;
    * the evaluator key may HELLO as the evaluator (or a monitor), PULL and ask STATUS;
    * a proxy key, at its own server process only, may HELLO as the proxy on its own
      connection,
      and relay (``depth`` > 1) the HELLOs, PUSHes, PULLs and STATUS of workers;
    * a server key is no client's.
    """
    if identity is None:
        return
    if server is not None and not identity.reaches(server):
        raise Refused(ErrorCode.FORBIDDEN, f"the key of {identity.name} is not admitted at "
                      f"server-{server}")
    if identity.role == "proxy":
        _check_proxy_claim(identity, header, depth)
        return
    if isinstance(header, Hello):
        claimed = Identity("worker", header.worker) if header.role == "worker" else None
        allowed = claimed == identity or (identity.role == "evaluator"
                                          and header.role in ("evaluator", "monitor"))
        if not allowed:
            raise Refused(ErrorCode.FORBIDDEN, f"the key of {identity.name} cannot say HELLO "
                          f"as {header.role} {header.worker}")
    elif isinstance(header, Push):
        if identity != Identity("worker", header.worker):
            raise Refused(ErrorCode.FORBIDDEN, f"the key of {identity.name} cannot push as "
                          f"worker {header.worker}")
    elif not isinstance(header, (Pull, Status)) or identity.role not in ("worker", "evaluator"):
        raise Refused(ErrorCode.FORBIDDEN, f"the key of {identity.name} cannot send "
                      f"{header.op.name}")


def _check_proxy_claim(identity: Identity, header: Header, depth: int) -> None:
    """A proxy's key: its own HELLO directly, workers' requests relayed."""
    relayed = depth > 1
    if isinstance(header, Hello):
        if header.role == ("worker" if relayed else "proxy"):
            return
        raise Refused(ErrorCode.FORBIDDEN, f"the key of {identity.name} cannot say HELLO as "
                      f"{header.role} {'for a relayed peer' if relayed else 'itself'}")
    if not relayed or not isinstance(header, (Push, Pull, Status)):
        raise Refused(ErrorCode.FORBIDDEN, f"the key of {identity.name} can send "
                      f"{header.op.name} only for the workers it relays")
