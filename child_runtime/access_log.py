"""What a standalone server (`managed-scorers serve`) says on stderr for the person running it:
where it listens, once ready, and one line per request (client, method, path, status, duration).

A managed child says none of this: its parent owns it and its log file holds its failures. The
OpenRLHF and UniRL routes' paths carry a secret, so those paths are logged with the secret left out;
query strings are never logged.
"""

from __future__ import annotations

import re
import socket
import sys
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

PREFIX = "managed-scorers serve:"
SECRET_ROUTES = ("/openrlhf/", "/unirl/")  # then the secret, then (UniRL's) its endpoint


def say(line: str) -> None:
    print(f"{PREFIX} {line}", file=sys.stderr, flush=True)


def listening(listener: socket.socket) -> None:
    """The URL clients use: the bound address and port (an IPv6 address in brackets)."""
    host, port = listener.getsockname()[:2]
    say(f"listening on http://{f'[{host}]' if ':' in host else host}:{port}")


def _shown_path(path: str) -> str:
    """The path with a secret route's secret masked, however the client spelled the route (`//`,
    another case: a base URL with a trailing slash doubles it), so no refused secret is logged."""
    squeezed = re.sub("/{2,}", "/", path)
    for route in SECRET_ROUTES:
        if squeezed.lower().startswith(route):
            _, slash, rest = squeezed[len(route) :].partition("/")
            return route + "<secret>" + slash + rest
    return path


class AccessLog:
    """ASGI middleware: one stderr line per HTTP request, written when its answer ends (or it
    fails)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        # no answer began: the client went away, or the server is stopping
        status: list[Any] = ["-"]

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            client = scope.get("client")
            peer = f"{client[0]}:{client[1]}" if client else "-"
            took_ms = (time.monotonic() - started) * 1000
            say(
                f'{peer} "{scope["method"]} {_shown_path(scope["path"])}" {status[0]} '
                f"{took_ms:.1f} ms"
            )
