"""Request bodies: read under a cap (refused with a 413 before more is read), and a JSON route's
bodies parsed off the event loop, one at a time, within the bounds of `protocol/bounded_json`.

Every JSON route goes through one `JsonBodies`: its own body cap, its parse in a worker thread of
its own (so /health and /drain are answered meanwhile), and one parse at a time, so that N bodies
that arrive together cost N bodies but never N parses (a parse builds up to PARSE_FACTOR times the
cap).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any, TypeVar

from starlette.requests import Request

from child_runtime.protocol import bounded_json
from child_runtime.protocol.items import RequestError

T = TypeVar("T")
PARSES_AT_ONCE = 1  # per route: what one parse may build, never several times over
# a body waits at most this long for the parse before it (a parse is bounded: ~1 s)
PARSE_WAIT_S = 60.0


class PayloadTooLarge(ValueError):
    """The body is over the route's cap (answered 413 before it is read in full)."""


class ParsesBusy(RuntimeError):
    """No parse slot came free within PARSE_WAIT_S (answered 503: try again)."""


async def read_body(request: Request, limit: int, setting: str = "max_request_bytes") -> bytes:
    """The request body, refused as soon as it is known to exceed `limit` bytes (`setting` names the
    cap)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise RequestError(f"content-length {declared[:40]!r} is not a byte count")
        if int(declared) > limit:
            raise PayloadTooLarge(f"request body of {declared} bytes exceeds {setting}={limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds {setting}={limit}")
        chunks.append(chunk)
    return b"".join(chunks)


class JsonBodies:
    """One JSON route's bodies: read under `bounds.max_bytes` (named `setting` in a refusal), then
    parsed by `bounded_json.loads` and made into the route's request in this route's worker thread,
    PARSES_AT_ONCE at a time."""

    def __init__(self, bounds: bounded_json.JsonBounds, setting: str) -> None:
        self.bounds, self.setting = bounds, setting
        self.parsing = 0  # parses running now (said on /health)
        self._slots = asyncio.Semaphore(PARSES_AT_ONCE)
        self._thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=PARSES_AT_ONCE, thread_name_prefix="json"
        )

    async def read(self, request: Request, made: Callable[[Any], T]) -> T:
        """What `made` makes of the body's JSON value (the route's request, checked), both in this
        route's thread: a large value is walked off the event loop too. PayloadTooLarge,
        JsonTooLarge, JsonTooDeep, RequestError, ParsesBusy, or whatever `made` raises."""
        body = await read_body(request, self.bounds.max_bytes, self.setting)
        try:
            async with asyncio.timeout(PARSE_WAIT_S):
                await self._slots.acquire()
        except TimeoutError as exc:
            raise ParsesBusy(
                f"no parse of this route came free within {PARSE_WAIT_S:g} s: try again"
            ) from exc

        def parsed() -> T:
            return made(bounded_json.loads(body, self.bounds))

        self.parsing += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, parsed)
        finally:
            self.parsing -= 1
            self._slots.release()
