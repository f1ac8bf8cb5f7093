"""Connections that have not made an authenticated request are bounded in number and in time.

Why: the child's port is reachable by every local user. Connections that never send
the token would otherwise hold descriptors until the child reaches RLIMIT_NOFILE, and
the parent's next fresh connection would fail. A pending connection is closed once it
has waited `timeout_s`, or when `max_pending` newer ones are pending; it is told so with
a 503 carrying EVICTED_HEADER, which the parent reads as "your request was not read":
safe to send again. A connection is admitted by its first request with the right token
and is never evicted after that.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from typing import Any

EVICTED_HEADER = "x-managed-scorers-evicted"
EVICTION_BODY = json.dumps({"error": "connection closed before it authenticated", "kind": "evicted"}).encode()
EVICTION = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    + EVICTED_HEADER.encode()
    + b": 1\r\nconnection: close\r\n"
    + f"content-length: {len(EVICTION_BODY)}\r\n\r\n".encode()
    + EVICTION_BODY
)

Peer = Any  # the transport's peername: (host, port) on TCP


class ConnectionGate:
    """Tracks pending (not yet authenticated) and admitted connections, by peer address. Runs on
    the event loop thread only."""

    def __init__(self, max_pending: int, timeout_s: float) -> None:
        self.max_pending = max_pending
        self.timeout_s = timeout_s
        self._pending: OrderedDict[Peer, asyncio.Transport] = OrderedDict()
        self._admitted: set[Peer] = set()
        self.evicted = 0

    @property
    def pending(self) -> int:
        return len(self._pending)

    def arrived(self, transport: asyncio.Transport) -> None:
        peer = transport.get_extra_info("peername")
        if peer is None:
            return
        self._pending[peer] = transport
        asyncio.get_running_loop().call_later(self.timeout_s, self._expire, peer, transport)
        while len(self._pending) > self.max_pending:
            self._evict(next(iter(self._pending)))

    def admit(self, peer: Peer) -> bool:
        """Called for each request with a valid token; False if its connection was already evicted."""
        if peer is None or peer in self._admitted:
            return True
        if self._pending.pop(peer, None) is None:
            return False
        self._admitted.add(peer)
        return True

    def left(self, transport: asyncio.Transport) -> None:
        peer = transport.get_extra_info("peername")
        if self._pending.get(peer) is transport:
            del self._pending[peer]
        self._admitted.discard(peer)

    def _expire(self, peer: Peer, transport: asyncio.Transport) -> None:
        if self._pending.get(peer) is transport:
            self._evict(peer)

    def _evict(self, peer: Peer) -> None:
        transport = self._pending.pop(peer)
        self.evicted += 1
        if not transport.is_closing():
            transport.write(EVICTION)
            transport.close()


def gated(protocol_class: type[asyncio.Protocol], gate: ConnectionGate) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class, reporting each connection's arrival and departure to `gate`."""

    class GatedProtocol(protocol_class):  # type: ignore[valid-type, misc]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            gate.arrived(transport)  # type: ignore[arg-type]

        def connection_lost(self, exc: Exception | None) -> None:
            gate.left(self.transport)
            super().connection_lost(exc)

    return GatedProtocol
