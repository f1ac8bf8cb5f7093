"""ChildClient: HTTP to one scorer server; transport errors are mapped once, here.

Used for managed children (loopback, per-launch token) and for remote scorer
servers someone else started. Never reads proxy settings from the environment.
"""
from __future__ import annotations

from typing import Any

import httpx

from child_runtime import wire


class ChildHTTPError(Exception):
    """The server answered with a non-2xx status."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        self.status = status
        self.kind = kind
        self.message = message
        super().__init__(f"HTTP {status} {kind}: {message}")


class ChildProtocolError(Exception):
    """The server answered 2xx with a body that is not what the protocol says."""


class ChildTransportError(Exception):
    """No answer: connection refused or reset, or a timeout (`timed_out`)."""

    def __init__(self, message: str, timed_out: bool) -> None:
        self.timed_out = timed_out
        super().__init__(message)


def _raise_for_status(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        kind, message = str(body.get("kind", "error")), str(body.get("error", response.text[:2000]))
    else:
        kind, message = "error", response.text[:2000]
    raise ChildHTTPError(response.status_code, kind, message)


class ChildClient:
    def __init__(self, base_url: str, token: str | None, request_timeout: float, control_timeout: float = 30.0):
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.request_timeout = request_timeout
        self.control_timeout = control_timeout
        self._http = httpx.Client(
            base_url=base_url, headers=headers, trust_env=False,
            timeout=httpx.Timeout(control_timeout, connect=min(control_timeout, 10.0)),
            limits=httpx.Limits(max_connections=16, max_keepalive_connections=16),
        )

    def _send(self, method: str, path: str, timeout: float, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
                                          **kwargs)
        except httpx.TimeoutException as exc:
            raise ChildTransportError(f"{method} {path}: no answer within {timeout} s ({exc!r})", True) from exc
        except httpx.TransportError as exc:
            raise ChildTransportError(f"{method} {path}: {exc!r}", False) from exc
        except (httpx.HTTPError, RuntimeError) as exc:  # e.g. DecodingError, or a client closed meanwhile
            raise ChildProtocolError(f"{method} {path}: {exc!r}") from exc
        _raise_for_status(response)
        return response

    def _json(self, method: str, path: str, timeout: float, **kwargs: Any) -> dict[str, Any]:
        response = self._send(method, path, timeout, **kwargs)
        try:
            body = response.json()
        except ValueError as exc:
            raise ChildProtocolError(f"{method} {path}: body is not JSON: {response.content[:200]!r}") from exc
        if not isinstance(body, dict):
            raise ChildProtocolError(f"{method} {path}: expected a JSON object, got {type(body).__name__}")
        return body

    def score(self, body: bytes) -> Any:
        """POST a framed request; returns the decoded response frame."""
        response = self._send("POST", "/score", self.request_timeout, content=body,
                              headers={"content-type": wire.CONTENT_TYPE})
        try:
            return wire.decode(response.content)
        except wire.WireError as exc:
            raise ChildProtocolError(f"POST /score: answer is not a valid frame: {exc}") from exc

    def health(self) -> dict[str, Any]:
        return self._json("GET", "/health", self.control_timeout)

    def onload(self) -> dict[str, Any]:
        return self._json("POST", "/onload", self.request_timeout)

    def offload(self) -> dict[str, Any]:
        return self._json("POST", "/offload", self.request_timeout)

    def drain(self, timeout_s: float) -> dict[str, Any]:
        return self._json("POST", "/drain", timeout_s + self.control_timeout, params={"timeout_s": timeout_s})

    def shutdown(self, timeout_s: float) -> dict[str, Any]:
        return self._json("POST", "/shutdown", timeout_s)

    def close(self) -> None:
        self._http.close()
