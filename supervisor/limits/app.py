"""The coordinator's HTTP routes (starlette): every caller's lease of every named endpoint.

    POST /limits/acquire {name, declared, tokens, wait_s, host} -> {lease, start_in, nodes}
                                                               or {refused, waited_s, detail}
    POST /limits/renew   {name, leases}                        -> {unknown}
    POST /limits/end     {name, lease, report}                 -> {known}
    GET  /livez                                                 (no token)

An acquire waits here, within its `wait_s`, for a lease to end or the rate to allow it (one event
loop: the boards need no lock; each endpoint's waiters wake on a condition when a lease ends). A
declaration that differs from a live board's is refused (409, as `LimitConflict` on a node). Every
route but /livez needs the bearer token: who holds it can lower or raise every caller's limits.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from scorers.limits import EndpointLimit
from scorers.limits.board import RENEW_S, Board, Grant, Hold

MAX_BODY_BYTES = 64 << 10
MAX_WAIT_S = 3600.0


class BadRequest(Exception):
    """A body the routes cannot take: answered 400 with why."""


class Coordinator:
    """Every endpoint's board, in this server's one event loop."""

    def __init__(self) -> None:
        self.boards: dict[str, Board] = {}
        self.wakes: dict[str, asyncio.Condition] = {}

    def board(self, limit: EndpointLimit, now: float) -> Board:
        board = self.boards.get(limit.name)
        if board is None or (board.limit != limit and board.idle(now)):
            board = self.boards[limit.name] = Board.new(limit, now)
            self.wakes.setdefault(limit.name, asyncio.Condition())
        elif board.limit != limit:
            raise Conflict(
                f"endpoint {limit.name!r}: live callers declared {board.limit.declared()}, "
                f"this one {limit.declared()} (the same name must carry the same limits)"
            )
        return board

    async def acquire(
        self, limit: EndpointLimit, tokens: int, wait_s: float, poll_s: float, host: str
    ) -> dict[str, Any]:
        """A lease, waited for here at most `poll_s` (the caller asks again after an `again`);
        refused when none can begin within `wait_s`."""
        began = time.monotonic()
        board = self.board(limit, began)
        nodes, end, poll_end = board.seen(host, began), began + wait_s, began + min(poll_s, wait_s)
        wake = self.wakes[limit.name]
        async with wake:
            while True:
                now = time.monotonic()
                offer = board.offer(tokens, now, end - now)
                if isinstance(offer, Grant):
                    return {"lease": offer.lease, "start_in": offer.start_in, "nodes": nodes,
                            "renew_s": RENEW_S}  # fmt: skip
                pause = _pause(offer, now, end, poll_end)
                if pause == "refuse":
                    return {"refused": offer.which, "waited_s": now - began, "nodes": nodes,
                            "detail": _needed(offer)}  # fmt: skip
                if isinstance(pause, str):  # "again"
                    return {"again": offer.which, "nodes": nodes}
                try:
                    await asyncio.wait_for(wake.wait(), pause)
                except TimeoutError:
                    pass  # a lease expired, a pause ended or the poll is up: look again

    async def end(self, name: str, lease: str, report: dict[str, Any]) -> bool:
        board = self.boards.get(name)
        if board is None:
            return False
        known = board.end(lease, report, time.monotonic())
        wake = self.wakes[name]
        async with wake:
            wake.notify_all()
        return known

    def renew(self, name: str, leases: list[str]) -> list[str]:
        board = self.boards.get(name)
        return list(leases) if board is None else board.renew(leases, time.monotonic())


class Conflict(Exception):
    """Another declaration of a live endpoint (409)."""


def _pause(offer: Hold, now: float, end: float, poll_end: float) -> float | str:
    """Seconds to wait before looking again; "refuse" (nothing can begin by `end`) or "again"
    (this request has waited its poll: the caller asks anew, so a hung coordinator is found)."""
    slot = offer.which.startswith("concurrency")
    if now >= end or (not slot and (offer.seconds is None or now + offer.seconds > end)):
        return "refuse"
    if now >= poll_end:
        return "again"
    # a lease may end any moment (a slot), a Retry-After ends at its time
    return max(min(poll_end - now, offer.seconds or poll_end - now), 0.001)


def _needed(offer: Hold) -> str:
    if offer.which.startswith("concurrency") or offer.seconds is None:
        return "no lease ended in time (coordinated)"
    return f"{offer.seconds:.2f} s more needed (coordinated)"


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise BadRequest(f"body over {MAX_BODY_BYTES} bytes")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"not JSON: {exc}") from exc
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        raise BadRequest("a JSON object with a string 'name' is needed")
    return body


def _number(body: dict[str, Any], key: str, low: float, high: float) -> float:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRequest(f"{key} must be a finite number, got {value!r}")
    if not low <= value <= high:
        raise BadRequest(f"{key} must lie in [{low:g}, {high:g}], got {value!r}")
    return float(value)


def app(token: str) -> Starlette:
    """The routes, each but /livez behind `token`."""
    coordinator = Coordinator()

    def allowed(request: Request) -> bool:
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())

    async def route(request: Request) -> Response:
        if not allowed(request):
            return JSONResponse({"error": "a bearer token is needed"}, status_code=401)
        try:
            body = await _body(request)
            return JSONResponse(await _answer(coordinator, request.path_params["what"], body))
        except BadRequest as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        except Conflict as exc:
            return JSONResponse({"error": str(exc)}, status_code=409)

    async def livez(_: Request) -> Response:
        return JSONResponse({"endpoints": len(coordinator.boards)})

    return Starlette(
        routes=[
            Route("/livez", livez, methods=["GET"]),
            Route("/limits/{what}", route, methods=["POST"]),
        ]
    )


async def _answer(coordinator: Coordinator, what: str, body: dict[str, Any]) -> dict[str, Any]:
    name = body["name"]
    if what == "acquire":
        declared = body.get("declared")
        if not isinstance(declared, dict):
            raise BadRequest("declared must be the endpoint's limits")
        try:
            limit = EndpointLimit(name=name, **declared)
        except (TypeError, ValueError) as exc:
            raise BadRequest(str(exc)) from exc
        tokens = int(_number(body, "tokens", 0, 1e12))
        wait_s = _number(body, "wait_s", 0, MAX_WAIT_S)
        poll_s = _number(body, "poll_s", 0, MAX_WAIT_S)
        host = str(body.get("host", "?"))[:200]
        return await coordinator.acquire(limit, tokens, wait_s, poll_s, host)
    if what == "renew":
        leases = body.get("leases")
        if not isinstance(leases, list) or not all(isinstance(x, str) for x in leases):
            raise BadRequest("leases must be a list of lease ids")
        return {"unknown": coordinator.renew(name, leases)}
    if what == "end":
        report = body.get("report")
        if not isinstance(body.get("lease"), str) or not isinstance(report, dict):
            raise BadRequest("end needs a lease id and a report")
        return {"known": await coordinator.end(name, body["lease"], _report(report))}
    raise BadRequest(f"no route /limits/{what} (acquire, renew, end)")


def _report(report: dict[str, Any]) -> dict[str, Any]:
    """How a call went, checked: numbers or null, `throttled` a bool."""
    checked: dict[str, Any] = {"throttled": report.get("throttled") is True}
    for key in ("tokens", "tokens_used", "latency_s", "retry_after_s"):
        if report.get(key) is not None:
            checked[key] = _number(report, key, 0, 1e12)
    return checked
