"""The one path by which a node's core answers what a peer sent, and what it does about
a peer's misconduct: the server's and the proxy's cores share it.

For each received message, :meth:`Answering.answer`:

* drops it unread if its key is barred (counted);
* bars the key of a message that broke a hard limit (``TOO_LARGE``), without a reply;
* refuses an undecodable message, or one outside its key's scope
  (``common.net.scopes.check_claim``), or one the handler refuses (``Refused``);
* turns any other exception of the handler into an ``INTERNAL`` refusal, logged with its
  traceback within the peer's budget: a bug must not end the node.

A refusal is counted by code, logged within the principal's log budget and answered
within its rate (``common.net.budgets.PeerPolicy``) with an ``ERROR`` whose text (which may
quote the peer's input) is cut to ``MAX_ERROR_TEXT`` characters. An offence the node's
in-flight guard reports (:meth:`Answering.offence`) bars the key it names, or is
counted as a cut connection when no message named one.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from common.net.budgets import PeerPolicy
from common.net.keys import Identity
from common.net.protocol import Error, ErrorCode, Header, Message, Refused
from common.net.scopes import check_claim
from common.net.transport import Incoming

MAX_ERROR_TEXT = 2000  # characters of an ERROR's message
R = TypeVar("R")  # what the core sends: a server's Reply, a proxy's Outgoing
H = TypeVar("H", bound=Header)  # one of the message types


def header_as(message: Message | None, kind: type[H]) -> H:
    """The header of ``message``, which a core's dispatch table (by header type) gave
    to the handler of ``kind``s: typed so (``TypeError`` if the table is wrong)."""
    header = message.header if message is not None else None
    if not isinstance(header, kind):
        raise TypeError(f"a {kind.__name__} handler got {type(header).__name__}")
    return header


def error_for(code: ErrorCode, text: str, round_: int) -> Error:
    """The ERROR answering a refusal: its text cut to ``MAX_ERROR_TEXT`` characters."""
    if len(text) > MAX_ERROR_TEXT:  # a peer's input quoted back stays bounded
        text = text[:MAX_ERROR_TEXT] + " ..."
    return Error(code=code.value, message=text, round=round_)


class Answering(Generic[R]):
    """A core's answers to its peers (see the module docstring).

    ``policy``: its ``PeerPolicy``; ``reply(envelope, error)``: the core's message that
    sends ``error`` back behind ``envelope``; ``current_round()``: the round an ERROR
    names; ``bar(identity, reason)``: the core's bar (the policy's, and what the core
    does besides); ``first``: the node's server process (the scope of a proxy's key).
    """

    def __init__(self, policy: PeerPolicy, reply: Callable[[list[Any], Error], R],
                 current_round: Callable[[], int], bar: Callable[[Identity, str], object],
                 first: int) -> None:
        self.policy = policy
        self.reply = reply
        self.current_round = current_round
        self.bar = bar
        self.first = first

    def answer(self, incoming: Incoming, principal: Hashable, now: float,
               handle: Callable[[Message], list[R]]) -> list[R]:
        """What the node sends for ``incoming``: ``handle(message)`` once the message is
        admitted, or the refusal (never raises for what a peer sent)."""
        identity = incoming.identity
        if self.policy.drops(identity):
            return []
        message = incoming.message
        try:
            if message is None:
                code = incoming.error.code if incoming.error else ErrorCode.MALFORMED
                if code is ErrorCode.TOO_LARGE and identity is not None:
                    self.policy.counters[code.value] += 1
                    self.bar(identity, f"sent a {incoming.error}")
                    return []
                raise Refused(code, str(incoming.error))
            check_claim(identity, message.header, len(incoming.envelope), self.first)
            return handle(message)
        except Refused as exc:
            return self.refuse(principal, incoming.envelope, exc.code, str(exc), now)
        except Exception as exc:  # a bug must not end the node: answer, count, log
            if self.policy.loggable("internal", principal, now) is not None:
                what = type(message.header).__name__ if message is not None else "a message"
                self.policy.log.exception("internal error handling %s", what)
            return self.refuse(principal, incoming.envelope, ErrorCode.INTERNAL,
                               f"{type(exc).__name__}: {exc}", now, logged=True)

    def refuse(self, principal: Hashable, envelope: list[Any], code: ErrorCode, text: str,
               now: float, logged: bool = False) -> list[R]:
        """Count, log and answer a refusal within the principal's budgets."""
        if self.policy.refuse(principal, code.value, text, now, logged) and envelope:
            return [self.reply(envelope, error_for(code, text, self.current_round()))]
        return []

    def offence(self, identity: Identity | None, reason: str, now: float) -> None:
        """The node's in-flight guard cut a connection of ``identity``: bar it (None: no
        message named its key; counted and logged)."""
        if identity is None:
            self.policy.cut(reason, now)
        else:
            self.bar(identity, reason)
