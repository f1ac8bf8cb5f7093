"""HTTP exchanges with one absolute deadline and a cap on the answer, over httpx.

httpx's timeouts apply to each socket operation, not to the exchange: a server that sends
a byte every 0.5 s holds a call with `timeout=2` for as long as it likes, and a 520 KB
gzip body decodes to 512 MiB in the caller. Here every connect, TLS handshake, write
and read of an exchange gets what is left of one deadline (a network backend wrapped
around httpcore's, through the connection pool httpx itself uses), the answer is read
raw and capped in bytes, and compression is refused: the request asks for
`Accept-Encoding: identity` and an answer in any other encoding fails.

An exchange may also be ended from another thread (`Cancel`): a client that sent the same
request to two servers closes the loser's request once the winner answered.

The one mechanism both HTTP clients of this project use: the remote backend's
(`supervisor.child.client`) and the LLM judge's. Importing it needs httpx.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

_WRITE_SLICE = 16 * 1024  # a TLS write is sent in slices, each with what is left of the deadline
_HTTPCORE_ERRORS = (
    httpcore.TimeoutException,
    httpcore.NetworkError,
    httpcore.ProtocolError,
    httpcore.ProxyError,
    httpcore.UnsupportedProtocol,
)
# the deadline of the exchange this thread is in (httpx's sync client runs in it), and its Cancel
_call = threading.local()
CANCELLED = "the exchange was cancelled"


class AnswerRefused(Exception):
    """The answer is larger than the cap, or compressed: nothing of it is decoded."""


class Cancel:
    """Ends, from any thread, the exchanges a thread runs under `with cancel.scope():`: a request
    sent to two servers whose loser is given up once the winner answered.

    `cancel()` shuts down the socket an exchange of the scope is using (its blocked read or write
    ends at once; httpcore then closes that connection, never pooling it again), and every later
    exchange of the scope fails before it sends: an httpx.ReadError (`CANCELLED`). The server may
    finish its work; its answer is never read. An exchange lets go of its socket once its whole
    answer is read, before the connection returns to the pool: a cancel never touches a connection
    another exchange took since."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._sockets: set[socket.socket] = set()

    def is_set(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            try:
                # the plain socket's: an SSLSocket's own shutdown would drop its TLS state under
                # the thread that reads it
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass  # closed already (its exchange failed and httpcore closed it): nothing to end

    @contextmanager
    def scope(self) -> Iterator[Cancel]:
        previous = getattr(_call, "cancel", None)
        _call.cancel = self
        try:
            yield self
        finally:
            _call.cancel = previous

    def _hold(self, sock: Any, error: type[httpcore.NetworkError]) -> None:
        """`sock` is what this scope's exchange reads or writes now; `error` once cancelled."""
        with self._lock:
            if self._cancelled:
                raise error(CANCELLED)
            if isinstance(sock, socket.socket):
                self._sockets.add(sock)

    def _let_go(self) -> None:
        with self._lock:
            self._sockets.clear()


def _held(stream: httpcore.NetworkStream, error: type[httpcore.NetworkError]) -> Cancel | None:
    """The Cancel of this thread's exchange, now holding `stream`'s socket (None: no scope)."""
    cancel: Cancel | None = getattr(_call, "cancel", None)
    if cancel is not None:
        cancel._hold(stream.get_extra_info("socket"), error)
    return cancel


@dataclass(frozen=True)
class Answer:
    status: int
    headers: httpx.Headers
    body: bytes


def _left(timeout: float | None, timed_out: type[httpcore.TimeoutException]) -> float | None:
    """`timeout`, shortened to what is left of this thread's deadline; raises once it has passed."""
    deadline = getattr(_call, "deadline", None)
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise timed_out("the exchange's deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        cancel = _held(self._inner, httpcore.ReadError)
        try:
            data = self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))
        except httpcore.NetworkError as exc:
            if cancel is not None and cancel.is_set():
                raise httpcore.ReadError(CANCELLED) from exc
            raise
        if cancel is not None and cancel.is_set():  # the shut-down socket's end of file
            raise httpcore.ReadError(CANCELLED)
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        _held(self._inner, httpcore.WriteError)
        sock = self._inner.get_extra_info("socket")
        if isinstance(sock, socket.socket) and not isinstance(sock, ssl.SSLSocket):
            # sendall's timeout bounds the whole send (Python 3.5+), however slowly the peer reads
            try:
                sock.settimeout(_left(timeout, httpcore.WriteTimeout))
                sock.sendall(buffer)
            except TimeoutError as exc:
                raise httpcore.WriteTimeout(str(exc) or "write timed out") from exc
            except OSError as exc:
                raise httpcore.WriteError(str(exc)) from exc
            return
        view = memoryview(buffer)  # TLS: each send waits at most what was left when its slice began
        for start in range(0, len(view), _WRITE_SLICE):
            self._inner.write(
                bytes(view[start : start + _WRITE_SLICE]), _left(timeout, httpcore.WriteTimeout)
            )

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> Any:
        return _DeadlineStream(
            self._inner.start_tls(
                ssl_context, server_hostname, _left(timeout, httpcore.ConnectTimeout)
            )
        )

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        last: Exception | None = None
        for address in _resolve(host, port, _left(timeout, httpcore.ConnectTimeout)):
            # one address at a time, each with what is left (not the whole timeout for every one)
            try:
                left = _left(timeout, httpcore.ConnectTimeout)
                return _DeadlineStream(
                    self._inner.connect_tcp(address, port, left, local_address, socket_options)
                )
            except httpcore.ConnectError as exc:
                last = exc
        raise last or httpcore.ConnectError(f"no address for {host}")

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        left = _left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._inner.connect_unix_socket(path, left, socket_options))

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def _resolve(host: str, port: int, left: float | None) -> list[str]:
    """The addresses of `host`, within `left` seconds: the resolver's own waits are not bounded, so
    it runs in a daemon thread that is left behind at the deadline."""
    found: list[Any] = []
    done = threading.Event()

    def lookup() -> None:
        try:
            found.extend(
                info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            )
        except OSError as exc:
            found.append(exc)
        finally:
            done.set()

    threading.Thread(target=lookup, name="bounded-http-resolve", daemon=True).start()
    if not done.wait(left):
        raise httpcore.ConnectTimeout(
            f"resolving {host!r} took longer than the exchange's deadline"
        )
    if found and isinstance(found[0], OSError):
        raise httpcore.ConnectError(f"cannot resolve {host!r}: {found[0]}")
    return list(dict.fromkeys(found))


@contextmanager
def _httpx_errors(request: httpx.Request) -> Iterator[None]:
    """httpcore's exceptions as httpx's own (every httpcore error has an httpx class of its
    name)."""
    try:
        yield
    except _HTTPCORE_ERRORS as exc:
        mapped = getattr(httpx, type(exc).__name__, httpx.TransportError)
        raise mapped(str(exc) or type(exc).__name__, request=request) from exc


class _Body(httpx.SyncByteStream):
    def __init__(self, stream: Any, request: httpx.Request) -> None:
        self._stream, self._request = stream, request

    def __iter__(self) -> Iterator[bytes]:
        with _httpx_errors(self._request):
            yield from self._stream

    def close(self) -> None:
        self._stream.close()


class _DeadlineTransport(httpx.BaseTransport):
    """httpx's own HTTP/1.1 connection pool, over the deadline network backend."""

    def __init__(self, proxy: str | None, max_connections: int, verify: bool) -> None:
        common: dict[str, Any] = {
            "ssl_context": httpx.create_ssl_context(verify=verify),
            "max_connections": max_connections,
            "max_keepalive_connections": max_connections,
            "network_backend": _DeadlineBackend(),
        }
        if proxy is None:
            self._pool: httpcore.ConnectionPool = httpcore.ConnectionPool(**common)
            return
        url = httpx.URL(proxy)
        if url.scheme not in ("http", "https"):
            raise ValueError(
                f"proxy {url.copy_with(username=None, password=None)}: only http and https "
                f"proxies work here"
            )
        target = httpcore.URL(
            scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
        )
        # user:password@ in the proxy's URL
        auth = (url.username, url.password) if url.username else None
        self._pool = httpcore.HTTPProxy(proxy_url=target, proxy_auth=auth, **common)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _httpx_errors(request):
            answer = self._pool.handle_request(core)
        return httpx.Response(
            answer.status,
            headers=answer.headers,
            stream=_Body(answer.stream, request),
            extensions=answer.extensions,
        )

    def close(self) -> None:
        self._pool.close()


def _proxy_for(url: str) -> str | None:
    """The environment's proxy for `url` (http_proxy / https_proxy, minus no_proxy), as httpx's
    trust_env."""
    parsed = httpx.URL(url)
    if urllib.request.proxy_bypass(parsed.host):
        return None
    proxies = urllib.request.getproxies()
    return proxies.get(parsed.scheme) or proxies.get("all")


def client(
    url: str,
    headers: Mapping[str, str] | None = None,
    trust_env: bool = False,
    max_connections: int = 16,
    base_url: bool = False,
    verify: bool = True,
) -> httpx.Client:
    """A client whose exchanges `exchange` bounds; with `trust_env`, through the environment's proxy
    for `url`. With `base_url`, request paths are relative to `url`. Redirects are never
    followed."""
    return httpx.Client(
        base_url=url if base_url else "",
        headers=dict(headers or {}),
        # the proxy, if any, is resolved here: an env-mounted transport would bypass the deadline
        trust_env=False,
        transport=_DeadlineTransport(
            _proxy_for(url) if trust_env else None, max_connections, verify
        ),
        follow_redirects=False,
    )


def _capped_body(response: httpx.Response, max_bytes: int) -> bytes:
    """The whole raw body, AnswerRefused once past `max_bytes` or when compressed."""
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise AnswerRefused(f"answer is compressed ({encoding!r}) although identity was asked for")
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise AnswerRefused(f"answer of {declared} bytes exceeds the cap of {max_bytes}")
    body = bytearray()
    for chunk in response.iter_raw():
        body += chunk
        if len(body) > max_bytes:
            raise AnswerRefused(f"answer exceeds the cap of {max_bytes} bytes")
    return bytes(body)


def exchange(
    http: httpx.Client,
    method: str,
    url: str,
    deadline: float,
    max_bytes: int,
    content: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    data: Mapping[str, str] | None = None,
    files: Mapping[str, Any] | None = None,
) -> Answer:
    """One request and its whole answer by `deadline` (time.monotonic): httpx.TimeoutException once
    it passes, whatever the server does; AnswerRefused for an answer over `max_bytes` or compressed.
    `data` and `files` make a multipart form, each file read from its open file as it is sent."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise httpx.ReadTimeout("the exchange's deadline passed before it began")
    cancel: Cancel | None = getattr(_call, "cancel", None)
    if cancel is not None and cancel.is_set():
        raise httpx.ReadError(CANCELLED)
    previous = getattr(_call, "deadline", None)
    _call.deadline = deadline
    try:
        sent = {**(headers or {}), "accept-encoding": "identity"}
        with http.stream(
            method,
            url,
            content=content,
            data=data,
            files=files,
            headers=sent,
            timeout=httpx.Timeout(left),
        ) as response:
            body = _capped_body(response, max_bytes)
            if cancel is not None:  # before the connection returns to the pool
                cancel._let_go()
            return Answer(response.status_code, response.headers, body)
    finally:
        if cancel is not None:
            cancel._let_go()
        _call.deadline = previous
