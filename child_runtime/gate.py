"""Connections that have not made an authenticated request are bounded in number and in time.

Why: the child's port is reachable by every local user. Connections that never send
the token would otherwise hold descriptors until the child reaches RLIMIT_NOFILE, and
the parent's next fresh connection would fail. A pending connection is evicted once it
has waited `timeout_s`, or when more than `max_pending` are pending (those that have
sent nothing go first, oldest first). Eviction answers a 503 carrying EVICTED_HEADER,
which the parent reads as "your request was not read": safe to send again. Up to
`max_pending` evicted connections are drained, not reset, for `linger_s`, so a parent
still sending a large body reads that answer instead of a connection reset; beyond
that budget (a flood) they are closed at once, so the descriptors a flood can hold stay
bounded. A connection is admitted by its first request with the right token and is
never evicted after that.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from child_runtime.protocol.headers import EVICTED_HEADER

EVICTION_BODY = json.dumps(
    {"error": "connection closed before it authenticated", "kind": "evicted"}
).encode()
EVICTION = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    + EVICTED_HEADER.encode()
    + b": 1\r\nconnection: close\r\n"
    + f"content-length: {len(EVICTION_BODY)}\r\n\r\n".encode()
    + EVICTION_BODY
)
LINGER_S = 1.0

Peer = Any  # the transport's peername: (host, port) on TCP


class Gated(asyncio.Protocol):
    """What the gate needs of a connection (see `gated`)."""

    peer: Peer
    heard: bool  # it has sent at least one byte

    def evict(self, lingered: Callable[[], None] | None) -> None:
        """Answer the eviction notice; drain for linger_s (then call `lingered`), or close at
        once."""


class ConnectionGate:
    """Pending (not yet authenticated) and admitted connections, by peer address. Event loop thread
    only."""

    def __init__(self, max_pending: int, timeout_s: float, linger_s: float = LINGER_S) -> None:
        self.max_pending = max_pending
        self.timeout_s = timeout_s
        self.linger_s = linger_s
        self._pending: OrderedDict[Peer, Gated] = OrderedDict()
        self._admitted: set[Peer] = set()
        self.lingering = 0
        self.evicted = 0

    @property
    def pending(self) -> int:
        return len(self._pending)

    def arrived(self, conn: Gated) -> None:
        if conn.peer is None:
            return
        self._pending[conn.peer] = conn
        asyncio.get_running_loop().call_later(self.timeout_s, self._expire, conn)
        while len(self._pending) > self.max_pending:
            silent = next((c for c in self._pending.values() if not c.heard), None)
            self._evict(silent or next(iter(self._pending.values())))

    def admit(self, peer: Peer) -> bool:
        """Called for each request with a valid token; False if its connection was already
        evicted."""
        if peer is None or peer in self._admitted:
            return True
        if self._pending.pop(peer, None) is None:
            return False
        self._admitted.add(peer)
        return True

    def left(self, conn: Gated) -> None:
        if self._pending.get(conn.peer) is conn:
            del self._pending[conn.peer]
        self._admitted.discard(conn.peer)

    def _expire(self, conn: Gated) -> None:
        if self._pending.get(conn.peer) is conn:
            self._evict(conn)

    def _evict(self, conn: Gated) -> None:
        del self._pending[conn.peer]
        self.evicted += 1
        if self.lingering < self.max_pending:
            self.lingering += 1
            conn.evict(self._lingered)
        else:
            conn.evict(None)

    def _lingered(self) -> None:
        self.lingering -= 1


def gated(protocol_class: type[asyncio.Protocol], gate: ConnectionGate) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class, with each connection reported to `gate` and evictable by
    it."""

    class GatedProtocol(protocol_class):  # type: ignore[valid-type, misc]
        peer: Peer = None
        heard = False
        _evicted = False

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self._transport = transport
            self.peer = transport.get_extra_info("peername")
            gate.arrived(self)

        def data_received(self, data: bytes) -> None:
            if self._evicted:
                return  # drained: its request is never read
            self.heard = True
            super().data_received(data)

        def eof_received(self) -> bool | None:
            if self._evicted:
                self._transport.close()
                return None
            return super().eof_received()

        def connection_lost(self, exc: Exception | None) -> None:
            gate.left(self)
            super().connection_lost(exc)

        def evict(self, lingered: Callable[[], None] | None) -> None:
            self._evicted = True
            _answer_eviction(self._transport, lingered, gate.linger_s)

    return GatedProtocol


def _answer_eviction(
    transport: asyncio.BaseTransport, lingered: Callable[[], None] | None, linger_s: float
) -> None:
    """Write the eviction notice; drain for linger_s (then call `lingered`), or close at once."""
    if transport.is_closing():
        if lingered is not None:
            lingered()
        return
    transport.write(EVICTION)  # type: ignore[attr-defined]
    if lingered is None:
        transport.close()
        return
    transport.resume_reading()  # type: ignore[attr-defined]  # flow control may have paused it

    def end() -> None:
        transport.abort()  # type: ignore[attr-defined]
        lingered()

    asyncio.get_running_loop().call_later(linger_s, end)
