"""The child's HTTP surface: starlette routes over one ScorerHost, behind a bearer token."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import hmac
import json
import os
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from child_runtime.bodies import JsonBodies, ParsesBusy, PayloadTooLarge, read_body
from child_runtime.gate import EVICTION_BODY, ConnectionGate
from child_runtime.host import ResidencyConflict, ResidencyFailed, ScorerHost
from child_runtime.idempotency import (
    AnswerCache,
    BadKey,
    IdempotencyConflict,
    body_digest,
    check_key,
)
from child_runtime.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from child_runtime.metrics import ChildMetrics
from child_runtime.openrlhf_route import CapabilityPath, loud
from child_runtime.protocol import openrlhf, unirl, wire
from child_runtime.protocol.bounded_json import JsonBounds, JsonTooLarge
from child_runtime.protocol.headers import (
    EVICTED_HEADER,
    IDENTITY_HEADER,
    KEY_HEADER,
    REPLAY_HEADER,
)
from child_runtime.protocol.items import (
    Limits,
    RequestError,
    request_from_wire,
    request_terms,
    response_to_wire,
)
from child_runtime.protocol.shared_segment import ChildSegment
from scorers.base import (
    CloseFailed,
    ScoreInputError,
    ScoreItem,
    ScorerContractError,
    ScorerWedged,
    ServerFault,
)

DEFAULT_DRAIN_TIMEOUT_S = 600.0
DEFAULT_LIMITS = Limits()
LIVEZ = "/livez"  # open: 200 while the event loop answers, and nothing else
# the scoring token, or the metrics token when one is set (`serve --metrics-token-file`)
METRICS = "/metrics"
# /score's JSON form (UniRL's protocol); any other type is the binary frame
JSON_TYPE = "application/json"
# the routes whose clients send no header (their secret rides in the path): where the client's user
# writes that path, and the endpoints that follow the secret
HEADERLESS = {
    openrlhf.ROUTE: ("--reward.remote_url", ("",)),
    unirl.ROUTE: ("UniRL's base_url", ("/health", "/score")),
}


class BearerAuth:
    """Pure ASGI middleware: every request needs `Authorization: Bearer <token>`, but those to the
    OpenRLHF and UniRL routes, which carry their secret in the path instead (`capabilities`, those
    served), `GET /livez`, which is open and says nothing but 200 (a liveness probe carries no
    secret), and `GET /metrics`, which also takes the metrics token when one is set (a Prometheus
    scrape that holds only that token can read the metrics and nothing else).

    A wrong or missing token or secret gets a 401 and the connection is closed; a right one admits
    its connection through the gate (which bounds connections that never authenticate; a /livez
    request admits nothing).
    """

    def __init__(
        self,
        app: ASGIApp,
        token: str,
        gate: ConnectionGate | None = None,
        metrics: ChildMetrics | None = None,
        capabilities: Sequence[CapabilityPath] = (),
        metrics_token: str | None = None,
    ) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()
        self._metrics_expected = (
            None if metrics_token is None else f"Bearer {metrics_token}".encode()
        )
        self._gate = gate
        # a refused token is counted too: a remote server's failed logins show
        self._metrics = metrics
        self._capabilities = tuple(capabilities)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            # no websockets, no lifespan
            raise RuntimeError(f"{scope['type']} connections are not served")
        path = scope.get("path", "")
        if path == LIVEZ:
            await self.app(scope, receive, send)
            return
        capability = next((c for c in self._capabilities if c.claims(path)), None)
        if capability is not None:
            inner = capability.inner(path)
            if inner is None:
                capability.refused(scope.get("client"))
                await self._refuse(
                    scope, receive, send, capability.route, "missing or wrong secret in the path"
                )
                return
            # the secret stops here
            scope = {**scope, "path": inner, "raw_path": inner.encode()}
        elif not self._authorized(dict(scope["headers"]).get(b"authorization", b""), path):
            await self._refuse(scope, receive, send, path, "missing or wrong bearer token")
            return
        if self._gate is not None and not self._gate.admit(scope.get("client")):
            await Response(
                EVICTION_BODY,
                status_code=503,
                media_type="application/json",
                headers={EVICTED_HEADER: "1", "connection": "close"},
            )(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorized(self, given: bytes, path: str) -> bool:
        if hmac.compare_digest(given, self._expected):
            return True
        metrics = self._metrics_expected
        return metrics is not None and path == METRICS and hmac.compare_digest(given, metrics)

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, path: str, why: str
    ) -> None:
        if self._metrics is not None:
            self._metrics.request(path, 401, 0.0)
            self._metrics.error("unauthorized")
        refusal = JSONResponse(
            {"error": why, "kind": "unauthorized"}, status_code=401, headers={"connection": "close"}
        )
        await refusal(scope, receive, send)


class RequestLedger:
    """Numbers every accepted score request so /drain can wait for exactly the earlier ones."""

    def __init__(self) -> None:
        self._next = 0
        self._active: set[int] = set()
        self._changed = asyncio.Event()

    @property
    def in_flight(self) -> int:
        return len(self._active)

    def begin(self) -> int:
        ticket = self._next
        self._next += 1
        self._active.add(ticket)
        return ticket

    def end(self, ticket: int) -> None:
        self._active.discard(ticket)
        self._changed.set()

    async def wait_before(self, limit: int, timeout_s: float) -> int:
        """Wait until no ticket below `limit` is active; returns how many were waited for."""
        waited = sum(1 for t in self._active if t < limit)
        async with asyncio.timeout(timeout_s):
            while any(t < limit for t in self._active):
                self._changed.clear()
                await self._changed.wait()
        return waited


def _error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "kind": kind}, status_code=status)


Handler = Callable[[Request], Awaitable[Response]]


def _guarded(handler: Handler, metrics: ChildMetrics | None = None) -> Handler:
    """Map every exception a handler lets through to a JSON answer; uvicorn never sees one; count
    each answer (and each error's kind) in `metrics`.

    An unhandled exception makes uvicorn drop the connection, which the parent
    would read as a dead child; a typed 4xx/5xx keeps the child serving.
    """

    async def run(request: Request) -> Response:
        started = time.perf_counter()
        response = await _answered(handler, request)
        if metrics is not None:
            metrics.request(request.url.path, response.status_code, time.perf_counter() - started)
            if response.status_code >= 400 and isinstance(response, JSONResponse):
                metrics.error(json.loads(bytes(response.body)).get("kind", "unknown"))
        return response

    return run


async def _answered(handler: Handler, request: Request) -> Response:  # noqa: C901 - one clause per kind
    """What `handler` answers, or the JSON error its exception maps to: the one place an exception
    becomes an answer, one except clause per kind (docs/gen_reference.py reads them for the HTTP
    page)."""
    try:
        return await handler(request)
    except unirl.IdentityMismatch as exc:
        return _error(409, "identity_mismatch", str(exc))
    except (PayloadTooLarge, JsonTooLarge) as exc:
        return _error(413, "too_large", str(exc))
    except ParsesBusy as exc:
        return _error(503, "busy", str(exc))
    except (wire.WireError, RequestError, BadKey) as exc:
        return _error(400, "bad_request", str(exc))
    except ScoreInputError as exc:
        return _error(422, "bad_input", str(exc))
    except IdempotencyConflict as exc:
        return _error(422, "idempotency_conflict", str(exc))
    except ResidencyConflict as exc:
        return _error(409, "offloaded", str(exc))
    except ResidencyFailed as exc:
        tail = "".join(traceback.format_exception(exc)[-6:])
        return _error(500, wire.RESIDENCY_FAILED, f"{exc}\n{tail}")
    except ScorerWedged as exc:  # the parent restarts this child (wire.RESTART_KINDS)
        return _error(503, wire.WEDGED if exc.timed_out else wire.WEDGED_QUEUED, str(exc))
    except ServerFault as exc:  # this server's fault, not the request's: a client fails over
        return _error(503, wire.SERVER_FAULT, str(exc))
    except CloseFailed as exc:
        return _error(500, wire.CLOSE_FAILED, str(exc))
    except ScorerContractError as exc:
        return _error(500, "contract", str(exc))
    except openrlhf.ItemsFailed as exc:
        return _error(500, "item_failed", str(exc))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises
        tail = "".join(traceback.format_exception(exc)[-6:])
        return _error(500, "scorer_error", f"{type(exc).__name__}: {exc}\n{tail}")


def _timeout_param(request: Request) -> float:
    raw = request.query_params.get("timeout_s", str(DEFAULT_DRAIN_TIMEOUT_S))
    try:
        value = float(raw)
    except ValueError as exc:
        raise RequestError(f"timeout_s must be a number, got {raw!r}") from exc
    if not 0 < value <= 86400:
        raise RequestError(f"timeout_s must be in (0, 86400], got {value}")
    return value


def package_versions(names: tuple[str, ...]) -> dict[str, str | None]:
    """Installed versions of the distributions a scorer declares (None when absent)."""
    # here: its import and its scan of site-packages are ~30 ms of a start
    import importlib.metadata

    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


class _Endpoints:
    """The child's endpoint handlers and the state they share: one per app."""

    def __init__(
        self,
        host: ScorerHost,
        request_exit: Callable[[], None],
        limits: Limits,
        segment: ChildSegment | None,
        gate: ConnectionGate | None,
        answers: AnswerCache | None,
        rank: int,
        serve_openrlhf: bool = False,
        serve_unirl: bool = False,
    ) -> None:
        self.host, self.request_exit, self.limits, self.segment, self.gate = (
            host,
            request_exit,
            limits,
            segment,
            gate,
        )
        self.serve_openrlhf, self.serve_unirl = serve_openrlhf, serve_unirl
        self.openrlhf_bodies = JsonBodies(
            JsonBounds(limits.openrlhf_max_request_bytes), "openrlhf_max_request_bytes"
        )
        self.json_bodies = JsonBodies(
            JsonBounds(limits.json_max_request_bytes), "json_max_request_bytes"
        )
        self.ledger = RequestLedger()
        self.cache = answers if answers is not None else AnswerCache()
        self.state = "ready"
        # One thread per call the host runs at once (one, unless the scorer declares concurrent
        # calls): a plain executor hands off in ~60 us where anyio's to_thread takes ~130 us, and
        # the event loop stays free for /health and /drain while a batch runs.
        self.worker = concurrent.futures.ThreadPoolExecutor(
            max_workers=host.concurrent_calls, thread_name_prefix="scorer"
        )
        self.spec = host.scorer.spec
        self.metrics = ChildMetrics(self.spec.name, rank)

    @functools.cached_property
    def packages(self) -> dict[str, str | None]:
        """Read at the first /health, not at boot."""
        return package_versions(self.spec.report_packages)

    async def in_worker(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.worker, fn, *args)

    def routes(self) -> list[Route]:
        metrics = self.metrics
        extra = [
            Route(openrlhf.ROUTE, loud(_guarded(self.openrlhf_score, metrics)), methods=["POST"])
        ]
        # UniRL's client: the same JSON handler as /score's, its health in UniRL's shape
        unirl_routes = [
            Route(f"{unirl.ROUTE}/health", _guarded(self.unirl_health, metrics), methods=["GET"]),
            Route(
                f"{unirl.ROUTE}/score",
                self.signed(_guarded(self.json_score, metrics)),
                methods=["POST"],
            ),
        ]
        return [
            Route(LIVEZ, self.livez, methods=["GET"]),
            Route("/health", _guarded(self.health, metrics), methods=["GET"]),
            Route(METRICS, _guarded(self.metrics_page), methods=["GET"]),
            Route("/score", self.signed(_guarded(self.score, metrics)), methods=["POST"]),
            Route("/onload", _guarded(self.onload, metrics), methods=["POST"]),
            Route("/offload", _guarded(self.offload, metrics), methods=["POST"]),
            Route("/drain", _guarded(self.drain, metrics), methods=["POST"]),
            Route("/shutdown", _guarded(self.shutdown, metrics), methods=["POST"]),
            *(extra if self.serve_openrlhf else []),
            *(unirl_routes if self.serve_unirl else []),
        ]

    def signed(self, handler: Handler) -> Handler:
        """Every answer of `handler`, an error too, names the identity of the scorer that made it: a
        client refuses one of another identity (a server restarted with other params) or of none."""

        async def run(request: Request) -> Response:
            response = await handler(request)
            if self.host.identity_hash:  # a served panel's is known once it is loaded
                response.headers[IDENTITY_HEADER] = self.host.identity_hash
            return response

        return run

    async def health(self, request: Request) -> Response:
        host, gate = self.host, self.gate
        return JSONResponse(
            {
                # a wedged scorer refuses every call: not ready, so a probe passes this server over
                # (and a standalone server's supervisor can restart it: nothing here can stop its
                # stuck thread)
                "state": "wedged"
                if host.wedged is not None and self.state == "ready"
                else self.state,
                **host.catalog_entry(),
                "pid": os.getpid(),
                "in_flight": self.ledger.in_flight,
                # JSON bodies being parsed now (off the loop)
                "json_parsing": self.openrlhf_bodies.parsing + self.json_bodies.parsing,
                "residency": host.residency,
                "gpu_residency": host.gpu_residency,
                # off the event loop: a served panel asks its terms' children
                "warming": await asyncio.to_thread(host.scorer.warming),
                "wedged": host.wedged,
                "packages": self.packages,
                "python": sys.executable,
                "sys_path": sys.path,
                "connections": {"pending": gate.pending, "evicted": gate.evicted} if gate else None,
                "idempotency": {"entries": self.cache.entries, "replays": self.cache.replays},
            }
        )

    async def livez(self, request: Request) -> Response:
        """Open (no token): 200 while the server's event loop answers; it says nothing of the scorer
        (its state, readiness and identity are /health's, behind the token)."""
        return PlainTextResponse("ok\n")

    async def score(self, request: Request) -> Response:
        """Scores a request: the binary frame, or with `content-type: application/json` UniRL's
        reward-service JSON (`unirl_score`)."""
        if request.headers.get("content-type", "").split(";")[0].strip().lower() == JSON_TYPE:
            return await self.json_score(request)
        ticket = self.ledger.begin()
        try:
            return await self._score(request)
        finally:
            self.ledger.end(ticket)

    async def _score(self, request: Request) -> Response:
        t0 = time.perf_counter()
        key = request.headers.get(KEY_HEADER)
        # before the body is read: a bad key costs nothing
        key = None if key is None else check_key(key)
        body = await read_body(request, self.limits.max_request_bytes)
        phases = [("receive", t0, time.perf_counter())]
        if key is None:
            answer, replayed = await self._produce(body, phases), False
        else:
            answer, replayed = await self.cache.answer(
                key, await body_digest(body), lambda: self._produce(body, phases)
            )
        headers = {
            "server-timing": ", ".join(
                f"{name};dur={1e3 * (end - start):.3f}" for name, start, end in phases
            )
        }
        if replayed:
            headers[REPLAY_HEADER] = "1"
        return Response(answer, media_type=wire.CONTENT_TYPE, headers=headers)

    async def _produce(self, body: bytes, phases: list[tuple[str, float, float]]) -> bytes:
        """Decode, score and encode one request's body; each phase's times go into `phases`."""
        t1 = time.perf_counter()
        shared = self.segment.view if self.segment else None
        meta = wire.decode(body, shared=shared)
        items, group_size = request_from_wire(
            meta, self.limits, copy_media=self.spec.writable_inputs
        )
        terms = request_terms(meta)
        t2 = time.perf_counter()
        result = await self.in_worker(self.host.score, items, group_size, terms)
        t3 = time.perf_counter()
        self.metrics.scored(len(items), t3 - t2)
        answer = wire.encode(response_to_wire(items, result))
        phases.extend((("decode", t1, t2), ("score", t2, t3), ("encode", t3, time.perf_counter())))
        return answer

    async def openrlhf_score(self, request: Request) -> Response:
        """OpenRLHF's JSON request, checked and scored as /score's would be (and counted for
        /drain)."""
        ticket = self.ledger.begin()
        try:
            items = await self.openrlhf_bodies.read(request, self._openrlhf_items)
            started = time.perf_counter()
            result = await self.in_worker(self.host.score, items, None)
            self.metrics.scored(len(items), time.perf_counter() - started)
            return JSONResponse(
                openrlhf.answer_of(result, self.spec.term_names(), self.spec.reward_term)
            )
        finally:
            self.ledger.end(ticket)

    async def json_score(self, request: Request) -> Response:
        """UniRL's JSON request, on /score (`content-type: application/json`) and on UniRL's secret
        route alike: its items' `idempotency_key` is echoed, never a replay key (the binary frame's
        header is refused here)."""
        if KEY_HEADER in request.headers:
            raise RequestError(
                f"{KEY_HEADER} is the binary frame's: a JSON request's idempotency_key is echoed"
            )
        return await self.unirl_score(request)

    async def unirl_health(self, request: Request) -> Response:
        """UniRL's `/health` (its client checks `required_rewards` against `rewards` once): the
        rewards this server answers and their sub-metrics; 503 unless it can score now."""
        wedged = self.host.wedged is not None and self.state == "ready"
        state = "wedged" if wedged else self.state
        return JSONResponse(
            {
                "status": "ok" if state == "ready" else state,
                "rewards": unirl.served_rewards(self.spec),
                "scorer_version": self.host.identity_hash or None,
            },
            status_code=200 if state == "ready" else 503,
        )

    async def unirl_score(self, request: Request) -> Response:
        """UniRL's reward-service request (JSON, `child_runtime.protocol.unirl`), parsed off the
        event loop under `json_max_request_bytes`, checked and scored as /score's frame would be
        (and counted for /drain); its answer is UniRL's `results`, `errors` and `identities`."""
        ticket = self.ledger.begin()
        try:
            parsed, items = await self.json_bodies.read(request, self._unirl_items)
            started = time.perf_counter()
            result = await self.in_worker(self.host.score, items, None, parsed.terms)
            self.metrics.scored(len(items), time.perf_counter() - started)
            return JSONResponse(unirl.answer(result, parsed, self.spec))
        finally:
            self.ledger.end(ticket)

    def _unirl_items(self, payload: Any) -> tuple[unirl.Parsed, list[ScoreItem]]:
        """UniRL's parsed body as checked items (in the route's parse thread: images are decoded
        there)."""
        parsed = unirl.parse(payload, self.spec, self.host.identity_hash, self.limits)
        return parsed, request_from_wire(
            parsed.wire, self.limits, copy_media=self.spec.writable_inputs
        )[0]

    def _openrlhf_items(self, payload: Any) -> list[ScoreItem]:
        """OpenRLHF's parsed body as checked items (in the route's parse thread: a large label is
        walked there)."""
        return request_from_wire(openrlhf.wire_request(openrlhf.samples_of(payload)), self.limits)[
            0
        ]

    async def onload(self, request: Request) -> Response:
        figures = await self.in_worker(self.host.onload)
        return JSONResponse({**figures, "residency": self.host.residency})

    async def offload(self, request: Request) -> Response:
        """Waits for a running score (the host lock), then moves the weights off the device."""
        figures = await self.in_worker(self.host.offload)
        return JSONResponse({**figures, "residency": self.host.residency})

    async def drain(self, request: Request) -> Response:
        """A barrier, not a state: later requests are still served."""
        timeout_s = _timeout_param(request)
        limit = self.ledger.begin()  # tickets below this one were accepted before the drain
        self.ledger.end(limit)
        try:
            waited = await self.ledger.wait_before(limit, timeout_s)
        except TimeoutError:
            return _error(504, "drain_timeout", f"requests still in flight after {timeout_s} s")
        return JSONResponse({"drained": waited})

    async def metrics_page(self, request: Request) -> Response:
        gate, host = self.gate, self.host
        page = self.metrics.render(
            self.ledger.in_flight, gate.pending if gate else None, host.residency, host.transitions
        )
        return Response(page, media_type=METRICS_CONTENT_TYPE)

    async def shutdown(self, request: Request) -> Response:
        self.state = "stopping"
        return JSONResponse({"state": "stopping"}, background=BackgroundTask(self.request_exit))


def build_app(
    host: ScorerHost,
    token: str,
    request_exit: Callable[[], None],
    limits: Limits = DEFAULT_LIMITS,
    segment: ChildSegment | None = None,
    gate: ConnectionGate | None = None,
    answers: AnswerCache | None = None,
    rank: int = 0,
    route_secrets: Mapping[str, str] | None = None,
    metrics_token: str | None = None,
) -> ASGIApp:
    """The child's ASGI app: its endpoints behind the bearer token and the connection gate; with a
    secret in `route_secrets` for OpenRLHF's route (`openrlhf.ROUTE`) or UniRL's (`unirl.ROUTE`),
    that route too, behind its secret in its path; with a `metrics_token`, /metrics for that token
    too."""
    secrets = dict(route_secrets or {})
    unknown = sorted(set(secrets) - set(HEADERLESS))
    if unknown:
        raise ValueError(f"route_secrets names {unknown}: the headerless routes are {HEADERLESS}")
    endpoints = _Endpoints(
        host,
        request_exit,
        limits,
        segment,
        gate,
        answers,
        rank,
        openrlhf.ROUTE in secrets,
        unirl.ROUTE in secrets,
    )
    app = Starlette(routes=endpoints.routes())
    app.router.redirect_slashes = False  # '/score/' is an unknown path (404), not a redirect
    capabilities = [
        CapabilityPath(route, secret, *HEADERLESS[route]) for route, secret in secrets.items()
    ]
    return BearerAuth(app, token, gate, endpoints.metrics, capabilities, metrics_token)
