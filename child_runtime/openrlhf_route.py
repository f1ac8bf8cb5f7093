"""The headerless routes' guards: a secret in the path, checked in constant time (`CapabilityPath`,
one class for OpenRLHF's route and UniRL's), and OpenRLHF's failures said loudly.

OpenRLHF's and UniRL's clients post to the URL exactly as configured and send no header, so the
only secret they can carry is the URL itself: the routes are `/openrlhf/<secret>` and
`/unirl/<secret>/{health,score}`. OpenRLHF's own failure handling is
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

# a flood of refusals or failed answers costs one log line of each kind per this many seconds
LOG_EVERY_S = 10.0
OPENRLHF_FATE = "OpenRLHF retries 5 times, then logs at INFO only and trains on reward=None"

Handler = Callable[[Request], Awaitable[Response]]


def log(level: str, message: str, source: str = "openrlhf") -> None:
    """One line on the server's log; a full or broken log is not a reason to fail the answer."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    try:
        print(f"{stamp} {level} child_runtime.{source}: {message}", file=sys.stderr, flush=True)
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
    """`<route>/<secret>[/<endpoint>]`: whoever knows the path may use the route's own endpoints,
    nothing more (OpenRLHF's `/openrlhf/<secret>`, UniRL's `/unirl/<secret>/health` and `/score`):
    `endpoints` are what may follow the secret. `configured_in` names where the client's user put
    the URL (said when a secret is refused)."""

    def __init__(
        self, route: str, secret: str, configured_in: str, endpoints: tuple[str, ...] = ("",)
    ) -> None:
        self.route, self.prefix, self.configured_in = route, route + "/", configured_in
        self.endpoints = endpoints
        self._expected = hashlib.sha256(secret.encode()).digest()
        self._refusals = Throttled()

    def claims(self, path: str) -> bool:
        return path == self.route or path.startswith(self.prefix)

    def inner(self, path: str) -> str | None:
        """The route's own path (the route, then the endpoint after the secret) when the secret is
        right and the endpoint one of the route's, else None (a wrong endpoint says nothing of the
        secret). Digests of equal length compared: the time taken says nothing of the secret, nor
        its length (a secret holds no '/': `serve` reads it so)."""
        secret, slash, rest = path[len(self.prefix) :].partition("/")
        supplied = hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()
        right = hmac.compare_digest(supplied, self._expected)
        return self.route + slash + rest if right and slash + rest in self.endpoints else None

    def refused(self, client: Any) -> None:
        """Count a wrong or missing secret; said at once, then at most once per LOG_EVERY_S."""
        peer = f"{client[0]}:{client[1]}" if client else "unknown"
        self._refusals.happened(
            lambda count: log(
                "WARNING",
                f"401 for {count} request(s) to {self.route}/<secret> with a wrong or missing "
                f"secret (the last from {peer}): check the secret in {self.configured_in}",
                self.route.strip("/"),
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
