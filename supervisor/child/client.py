"""ScorerClient: the endpoints of one scorer server, over one of two HTTP transports.

Managed children are reached through `LoopbackHTTP` (our own child on 127.0.0.1,
optionally with the shared-memory data plane); servers someone else started
through httpx. Both raise the same transport facts (`supervisor.errors`), mapped
once from their own exceptions; neither reads proxy settings from the environment.
Non-2xx answers raise `ErrorStatus`; what a failure means is the backend's call.
"""

from __future__ import annotations

import json
import time
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import httpx

from child_runtime.protocol import wire
from child_runtime.protocol.headers import IDENTITY_HEADER, KEY_HEADER, REPLAY_HEADER
from scorers.common import bounded_http
from supervisor.child.loopback_http import LoopbackHTTP
from supervisor.child.segment import ParentSegment
from supervisor.errors import (
    BadAnswer,
    ConnectFailed,
    ConnectionLost,
    ErrorStatus,
    IdentityMismatch,
    NoAnswer,
)

Body = Sequence[bytes | memoryview]
# what a remote server's answer may hold once read (scores of a chunk are kilobytes; /health a few)
DEFAULT_MAX_ANSWER_BYTES = 64 * 2**20
MAX_CONNECTIONS = 16  # to one remote server: also the most chunks of a request in flight to it


class Transport(Protocol):
    def request(
        self, method: str, path: str, timeout: float, body: Body, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes | bytearray]: ...

    def reset(self) -> None: ...

    def close(self) -> None: ...


def _raise_for_status(status: int, content: bytes | bytearray) -> None:
    if 200 <= status < 300:
        return
    text = bytes(content[:2000]).decode("utf-8", "replace")
    try:
        body = json.loads(content)
    except ValueError:
        body = None
    if isinstance(body, dict):
        kind, message = str(body.get("kind", "error")), str(body.get("error", text))
    else:
        kind, message = "error", text
    raise ErrorStatus(status, kind, message)


@contextmanager
def _transport_facts(method: str, path: str, timeout: float) -> Iterator[None]:
    """httpx's exceptions (and the cap's refusal) as transport facts: the one mapping for remote
    servers."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise NoAnswer(
            f"{method} {path}: no whole answer within {timeout:.3g} s ({exc!r})"
        ) from exc
    except httpx.ConnectError as exc:
        raise ConnectFailed(f"{method} {path}: {exc!r}") from exc
    except httpx.TransportError as exc:
        raise ConnectionLost(f"{method} {path}: {exc!r}") from exc
    except bounded_http.AnswerRefused as exc:
        raise BadAnswer(f"{method} {path}: {exc}") from exc
    # its client was closed meanwhile (an interrupt, a close): nothing came back
    except RuntimeError as exc:
        raise ConnectionLost(f"{method} {path}: {exc}") from exc
    except httpx.HTTPError as exc:  # e.g. a malformed answer
        raise BadAnswer(f"{method} {path}: {exc!r}") from exc


class HttpxTransport:
    """For servers someone else started: full HTTP (TLS, chunked answers; redirects refused), each
    exchange within one absolute deadline and its answer capped (`scorers.common.bounded_http`)."""

    def __init__(self, base_url: str, headers: dict[str, str], max_answer_bytes: int) -> None:
        self._base_url, self._headers = base_url, headers
        self._http = bounded_http.client(
            base_url, headers, base_url=True, max_connections=MAX_CONNECTIONS
        )
        self.max_answer_bytes = max_answer_bytes

    def request(
        self, method: str, path: str, timeout: float, body: Body, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        content = b"".join(body) if body else None
        deadline = time.monotonic() + timeout
        with _transport_facts(method, path, timeout):
            answer = bounded_http.exchange(
                self._http,
                method,
                path,
                deadline,
                self.max_answer_bytes,
                content=content,
                headers=headers,
            )
        return answer.status, dict(answer.headers), answer.body

    def upload(
        self, path: str, timeout: float, fields: Mapping[str, str], files: Mapping[str, Any]
    ) -> tuple[int, dict[str, str], bytes]:
        """POST a multipart form whose files are streamed from their open files (never read
        whole)."""
        deadline = time.monotonic() + timeout
        with _transport_facts("POST", path, timeout):
            answer = bounded_http.exchange(
                self._http, "POST", path, deadline, self.max_answer_bytes, data=fields, files=files
            )
        return answer.status, dict(answer.headers), answer.body

    def reset(self) -> None:
        """Drop every connection (an exchange on one fails at once); the next request opens new
        ones."""
        old, self._http = (
            self._http,
            bounded_http.client(
                self._base_url, self._headers, base_url=True, max_connections=MAX_CONNECTIONS
            ),
        )
        old.close()

    def close(self) -> None:
        self._http.close()


class LoopbackTransport:
    """For our own managed child: the lean keep-alive client."""

    def __init__(self, port: int, headers: dict[str, str], peer_alive: Callable[[], bool]) -> None:
        self.http = LoopbackHTTP("127.0.0.1", port, headers, peer_alive=peer_alive)

    def request(
        self, method: str, path: str, timeout: float, body: Body, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytearray]:
        answer = self.http.request(method, path, timeout, body, headers)
        return answer.status, answer.headers, answer.body

    def reset(self) -> None:
        self.http.drop_idle()

    def close(self) -> None:
        self.http.close()


class ScorerClient:
    """One scorer server at `url`. With a `segment`, arrays of at least `shared_min_bytes` travel
    through it.

    Once its backend sets `identity` (the scorer identity hash it was made for), every /score answer
    must name that identity (`IDENTITY_HEADER`): one of another, or a successful one of none, raises
    `IdentityMismatch` before anything of it is read; an error answer of none (a proxy's) is an
    error answer as before. The one check for managed, remote and multi-server clients alike."""

    def __init__(
        self,
        transport: Transport,
        request_timeout: float,
        control_timeout: float = 30.0,
        segment: ParentSegment | None = None,
        shared_min_bytes: int = 64 * 1024,
        url: str = "",
    ) -> None:
        self.transport = transport
        self.url = url
        # what every /score answer must name, once the backend knows it
        self.identity: str | None = None
        self.request_timeout = request_timeout
        self.control_timeout = control_timeout
        self.segment = segment
        self.shared_min_bytes = shared_min_bytes
        self.last_server_timing: str | None = None  # the child's phases for the last /score (ms)
        # the last /score was answered from the child's idempotency cache
        self.last_replayed = False
        # /score bodies sent over the socket (arrays included when not shared)
        self.in_band_bytes = 0

    @classmethod
    def remote(
        cls,
        base_url: str,
        token: str | None,
        request_timeout: float,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    ) -> ScorerClient:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return cls(
            HttpxTransport(base_url, headers, max_answer_bytes), request_timeout, url=base_url
        )

    @classmethod
    def loopback(
        cls,
        port: int,
        token: str,
        request_timeout: float,
        peer_alive: Callable[[], bool],
        segment: ParentSegment | None,
        shared_min_bytes: int,
    ) -> ScorerClient:
        transport = LoopbackTransport(port, {"authorization": f"Bearer {token}"}, peer_alive)
        return cls(
            transport,
            request_timeout,
            segment=segment,
            shared_min_bytes=shared_min_bytes,
            url=f"http://127.0.0.1:{port}",
        )

    def _send(
        self,
        method: str,
        path: str,
        timeout: float,
        body: Body = (),
        headers: dict[str, str] | None = None,
    ) -> bytes | bytearray:
        status, answer_headers, content = self.transport.request(
            method, path, timeout, body, headers or {}
        )
        if path == "/score":
            self._check_identity(status, answer_headers.get(IDENTITY_HEADER))
        _raise_for_status(status, content)
        if path == "/score":
            self.last_server_timing = answer_headers.get("server-timing")
            self.last_replayed = answer_headers.get(REPLAY_HEADER) == "1"
        return content

    def _check_identity(self, status: int, named: str | None) -> None:
        expected = self.identity
        if (
            expected is not None
            and named != expected
            and (named is not None or 200 <= status < 300)
        ):
            raise IdentityMismatch(self.url, expected, named)

    def _json(self, method: str, path: str, timeout: float) -> dict[str, Any]:
        content = self._send(method, path, timeout)
        try:
            body = json.loads(content)
        except ValueError as exc:
            raise BadAnswer(f"{method} {path}: body is not JSON: {bytes(content[:200])!r}") from exc
        if not isinstance(body, dict):
            raise BadAnswer(f"{method} {path}: expected a JSON object, got {type(body).__name__}")
        return body

    def uses_segment(self, frame: wire.Frame) -> bool:
        """Arrays large enough (or already in the segment, from an arena), and a segment still open
        (a forked copy of the trainer has dropped it)."""
        segment = self.segment
        if (
            segment is None
            or segment.fd < 0
            or frame.array_bytes > segment.capacity
            or not frame.arrays
        ):
            return False
        return frame.array_bytes >= self.shared_min_bytes or any(
            not isinstance(a, array) and segment.locate(a) is not None for a in frame.arrays
        )  # a stdlib array (a child's scores) is never in an arena

    def score(
        self, frame: wire.Frame, idempotency_key: str | None = None, timeout: float | None = None
    ) -> Any:
        """POST a framed request (arrays in-band or through the segment); returns the decoded
        answer.

        With an `idempotency_key`, re-sending the same frame with the same key is answered from the
        child's cache (or waits for the first send's scoring) instead of scoring it again."""
        headers = {"content-type": wire.CONTENT_TYPE}
        if idempotency_key is not None:
            headers[KEY_HEADER] = idempotency_key
        timeout = self.request_timeout if timeout is None else timeout
        content = self._score_shared(frame, headers, timeout) if self.uses_segment(frame) else None
        if content is None:
            parts = frame.body_parts()
            self.in_band_bytes += sum(memoryview(part).nbytes for part in parts)
            content = self._send("POST", "/score", timeout, parts, headers)
        try:
            return wire.decode(content)
        except wire.WireError as exc:
            raise BadAnswer(f"POST /score: answer is not a valid frame: {exc}") from exc

    def _score_shared(
        self, frame: wire.Frame, headers: dict[str, str], timeout: float
    ) -> bytes | bytearray | None:
        """Arrays through the segment, their extents held until the answer is in (the child reads
        them meanwhile); None when the segment cannot take them: send in-band."""
        assert self.segment is not None
        with self.segment.placement() as place:
            try:
                body = frame.shared_body(place)
            # no extent free (arenas hold it), or no pages behind one
            except (MemoryError, OSError):
                return None
            except ValueError as exc:  # the segment was closed meanwhile: the backend is closing
                raise ConnectionLost(f"POST /score: shared segment: {exc!r}") from exc
            return self._send("POST", "/score", timeout, [body], headers)

    def health(self, timeout: float | None = None) -> dict[str, Any]:
        return self._json("GET", "/health", self.control_timeout if timeout is None else timeout)

    def onload(self, timeout: float | None = None) -> dict[str, Any]:
        return self._json("POST", "/onload", self.request_timeout if timeout is None else timeout)

    def offload(self, timeout: float | None = None) -> dict[str, Any]:
        return self._json("POST", "/offload", self.request_timeout if timeout is None else timeout)

    def drain(self, timeout_s: float, timeout: float | None = None) -> dict[str, Any]:
        """The child waits up to `timeout_s`; the HTTP call up to `timeout` (default: that plus
        control)."""
        timeout = timeout_s + self.control_timeout if timeout is None else timeout
        return self._json("POST", f"/drain?timeout_s={timeout_s!r}", timeout)

    def shutdown(self, timeout_s: float) -> dict[str, Any]:
        return self._json("POST", "/shutdown", timeout_s)

    def close(self) -> None:
        self.transport.close()
