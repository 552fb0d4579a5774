"""The tag of a checkpoint file: who may have written it.

With keys, HMAC-SHA256 under a key derived from the server's CURVE secret: only that
server (or whoever holds its secret) writes a file its reader accepts, so a file of
another shard's server, of another run's keys, or planted by an insider who can write
the output directory is refused. With ``--insecure``, a plain SHA-256: it detects a
torn or corrupted file, **not forgery**.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from common.net.keys import KeyRing

MAC_LABEL = b"byzps/checkpoint-mac/v1/server-"


def checkpoint_mac_key(secret: bytes, shard: int) -> bytes:
    """The MAC key of server ``shard``'s checkpoints, derived from its CURVE secret by
    a labelled hash (HMAC-SHA256 of ``MAC_LABEL + shard``): never the CURVE key itself,
    which then keys nothing else."""
    return hmac.new(secret, MAC_LABEL + str(shard).encode("ascii"), hashlib.sha256).digest()


def server_mac_key(keys: KeyRing | None, shard: int,
                   process: int | None = None) -> bytes | None:
    """The MAC key of ``shard``'s checkpoints from the run's key ring: derived from the
    secret of the server process hosting it, ``server-<process>`` (a process is named by
    its first shard; default: the shard's own process), labelled with the shard; None
    without keys (``--insecure``: unkeyed digests)."""
    if keys is None:
        return None
    owner = shard if process is None else process
    return checkpoint_mac_key(keys.pair(f"server-{owner}")[1], shard)


def digest(key: bytes | None, head: bytes) -> Any:
    """A running tag over ``head`` (the line and table); ``update`` it with each array's
    bytes, then compare its ``digest()`` with ``hmac.compare_digest``."""
    return hashlib.sha256(head) if key is None else hmac.new(key, head, hashlib.sha256)


def tag(key: bytes | None, head: bytes, arrays: Iterable[Any]) -> bytes:
    """The tag of a file of ``head`` and ``arrays`` (buffers) under ``key``."""
    running = digest(key, head)
    for array in arrays:
        running.update(array)
    return running.digest()

