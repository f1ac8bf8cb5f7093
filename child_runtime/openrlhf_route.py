"""The OpenRLHF route's guards: a secret in the path, checked in constant time, and failures said
loudly.

OpenRLHF's client posts to the URL exactly as configured and sends no header, so the only secret
it can carry is the URL itself: the route is `/openrlhf/<secret>`. Its own failure handling is
quiet (five tries, then one INFO line and `reward=None`), so this side says every refusal and
every failed answer on the server's log, with the typed error text: the first of a kind at once,
then at most one line per LOG_EVERY_S with how many there were (`Throttled`), so that a flood of bad
requests cannot fill the log.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from child_runtime.protocol.openrlhf import ROUTE

# a flood of refusals or failed answers costs one log line of each kind per this many seconds
LOG_EVERY_S = 10.0
OPENRLHF_FATE = "OpenRLHF retries 5 times, then logs at INFO only and trains on reward=None"

Handler = Callable[[Request], Awaitable[Response]]


def log(level: str, message: str) -> None:
    """One line on the server's log; a full or broken log is not a reason to fail the answer."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    try:
        print(f"{stamp} {level} child_runtime.openrlhf: {message}", file=sys.stderr, flush=True)
    except OSError:
        pass  # the answer still carries the error to the client


class Throttled:
    """One kind of event said on the log: the first at once, then at most once per `every_s`, with
    the count of those since the last line (the ones between are counted, not said)."""

    def __init__(self, every_s: float = LOG_EVERY_S) -> None:
        self.every_s = every_s
        self._count = 0
        self._said_at = -every_s

    def happened(self, say: Callable[[int], None]) -> None:
        """Count one; call `say(count)` when a line is due."""
        self._count += 1
        now = time.monotonic()
        if now - self._said_at >= self.every_s:
            say(self._count)
            self._said_at, self._count = now, 0


class CapabilityPath:
    """`/openrlhf/<secret>`: whoever knows the path may score, nothing more (no other endpoint)."""

    def __init__(self, secret: str) -> None:
        self.prefix = ROUTE + "/"
        self._expected = hashlib.sha256((self.prefix + secret).encode()).digest()
        self._refusals = Throttled()

    def claims(self, path: str) -> bool:
        return path == ROUTE or path.startswith(self.prefix)

    def admits(self, path: str) -> bool:
        """Digests of equal length compared: the time taken says nothing of the secret, nor its
        length."""
        supplied = hashlib.sha256(path.encode("utf-8", "surrogatepass")).digest()
        return hmac.compare_digest(supplied, self._expected)

    def refused(self, client: Any) -> None:
        """Count a wrong or missing secret; said at once, then at most once per LOG_EVERY_S."""
        peer = f"{client[0]}:{client[1]}" if client else "unknown"
        self._refusals.happened(
            lambda count: log(
                "WARNING",
                f"401 for {count} request(s) to {ROUTE}/<secret> with a wrong or missing secret "
                f"(the last from {peer}): check the secret in --reward.remote_url",
            )
        )


def loud(handler: Handler) -> Handler:
    """Say each error answer (4xx or 5xx, with its kind and text) at ERROR before OpenRLHF hides it:
    each status and kind at once, then at most once per LOG_EVERY_S with how many there were."""
    kinds: dict[tuple[int, str], Throttled] = {}

    async def run(request: Request) -> Response:
        response = await handler(request)
        if response.status_code >= 400:
            detail = json.loads(bytes(response.body)) if isinstance(response, JSONResponse) else {}
            kind, error = detail.get("kind", "unknown"), detail.get("error", "")
            status = response.status_code
            kinds.setdefault((status, kind), Throttled()).happened(
                lambda count: log(
                    "ERROR", f"answered {status} {kind} x{count} ({OPENRLHF_FATE}): {error}"
                )
            )
        return response

    return run
