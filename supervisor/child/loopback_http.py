"""A minimal HTTP/1.1 keep-alive client for our own child on 127.0.0.1.

Why not httpx here: on this path every call pays httpx's per-request machinery
(~0.2 ms, measured against the same uvicorn child), which is more than half the
round-trip budget. The peer is our own uvicorn child, so the protocol subset is
small and known. Each request has one deadline across connect, send and receive.
Bodies go out with one `sendmsg` of the frame's buffers (no join, no copy), and
answers must carry a content-length. httpx stays in use for servers someone else
started (RemoteRewardBackend), where TLS, proxies and the full protocol matter.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from child_runtime.protocol.headers import EVICTED_HEADER
from scorers.common.retry import Retry
from supervisor.errors import BadAnswer, ConnectFailed, ConnectionLost, NoAnswer

MAX_HEAD_BYTES = 64 * 1024
MAX_ANSWER_BYTES = 1 << 30
_CRLF2 = b"\r\n\r\n"
RETRY_BACKOFF_S = (0.005, 0.2)  # first and largest pause between tries that sent nothing usable
CONNECT_TRY_S = 1.0  # a dropped SYN is resent after 1 s: try again rather than wait for it
_LOCAL_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class _Evicted(ConnectionLost):
    """The child's gate closed this connection before reading the request: a try worth repeating."""


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytearray


class _Deadline:
    def __init__(self, timeout: float) -> None:
        self.at = time.monotonic() + timeout
        self.timeout = timeout

    def arm(self, sock: socket.socket) -> None:
        left = self.at - time.monotonic()
        if left <= 0:
            raise NoAnswer(f"no answer within {self.timeout} s")
        sock.settimeout(left)


def _send_all(sock: socket.socket, parts: list[memoryview], deadline: _Deadline) -> None:
    while parts:
        deadline.arm(sock)
        sent = sock.sendmsg(parts[:512])  # IOV_MAX is 1024 on Linux
        while sent:
            if sent >= len(parts[0]):
                sent -= len(parts[0])
                parts.pop(0)
            else:
                parts[0] = parts[0][sent:]
                sent = 0


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    try:
        lines = head.decode("latin-1").split("\r\n")
        version, code = lines[0].split(" ", 2)[:2]
        status = int(code)
    except (ValueError, IndexError) as exc:
        raise BadAnswer(f"bad status line {head[:80]!r}") from exc
    if version != "HTTP/1.1":
        raise BadAnswer(f"expected HTTP/1.1, got {version[:20]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise BadAnswer(f"bad header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    return status, headers


class _Connection:
    def __init__(self, address: tuple[str, int], deadline: _Deadline) -> None:
        # one try, not the whole deadline
        left = max(0.001, min(CONNECT_TRY_S, deadline.at - time.monotonic()))
        self.sock = socket.create_connection(address, timeout=left)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = bytearray()

    def stale(self) -> bool:
        """An idle connection the server has closed (EOF or unexpected bytes) must not be reused."""
        self.sock.setblocking(False)  # with a timeout set, recv would poll first and block
        try:
            self.sock.recv(1, socket.MSG_PEEK)
            return True
        except BlockingIOError:
            return False
        except OSError:
            return True

    def exchange(
        self, head: bytes, body: Sequence[bytes | memoryview], deadline: _Deadline
    ) -> tuple[Answer, bool]:
        """One request and its answer; also says whether the connection may be reused."""
        _send_all(
            self.sock,
            [memoryview(head)] + [memoryview(b).cast("B") for b in body if len(b)],
            deadline,
        )
        while (end := self.buffer.find(_CRLF2)) < 0:
            if len(self.buffer) > MAX_HEAD_BYTES:
                raise BadAnswer(f"answer head exceeds {MAX_HEAD_BYTES} bytes")
            self._read_some(deadline)
        status, headers = _parse_head(bytes(self.buffer[:end]))
        if "content-length" not in headers or "transfer-encoding" in headers:
            raise BadAnswer(f"answer {status} has no content-length (headers {sorted(headers)})")
        length = headers["content-length"]
        if not (length.isascii() and length.isdigit()) or int(length) > MAX_ANSWER_BYTES:
            raise BadAnswer(f"bad content-length {length[:40]!r}")
        body_out = self._read_exact(end + 4, int(length), deadline)
        reusable = headers.get("connection", "").lower() != "close"
        return Answer(status, headers, body_out), reusable

    def _read_some(self, deadline: _Deadline) -> None:
        deadline.arm(self.sock)
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionLost("server closed the connection before answering")
        self.buffer += chunk

    def _read_exact(self, start: int, length: int, deadline: _Deadline) -> bytearray:
        out = bytearray(length)
        have = min(length, len(self.buffer) - start)
        out[:have] = self.buffer[start : start + have]
        leftover = self.buffer[start + have :]
        view = memoryview(out)
        while have < length:
            deadline.arm(self.sock)
            got = self.sock.recv_into(view[have:])
            if not got:
                raise ConnectionLost(
                    f"server closed the connection after {have} of {length} body bytes"
                )
            have += got
        self.buffer = bytearray(leftover)  # bytes past the answer mean the server misbehaved
        return out

    def close(self) -> None:
        self.sock.close()


class LoopbackHTTP:
    """Thread-safe; each request holds one connection, idle ones are kept for reuse.

    A try that provably sent nothing the server acted on is repeated until the request's
    deadline, and only while `peer_alive()` says the server process lives: a connection
    that cannot be opened, or one the child's connection gate evicted before reading the
    request (answered 503 with the gate's header). If no try gets through, ConnectFailed
    says that nothing was acted on. Anything else is raised at once.
    """

    def __init__(
        self,
        host: str,
        port: int,
        headers: dict[str, str],
        max_idle: int = 16,
        peer_alive: Callable[[], bool] = lambda: False,
    ) -> None:
        self.address = (host, port)
        self._fixed = "".join(
            f"{k}: {v}\r\n" for k, v in {"host": f"{host}:{port}", **headers}.items()
        )
        self._idle: list[_Connection] = []
        self._max_idle = max_idle
        self._peer_alive = peer_alive
        self._lock = threading.Lock()
        self._closed = False
        # tries repeated because nothing was sent or read (connect failure, eviction)
        self.retries = 0

    def _take(self, deadline: _Deadline) -> _Connection:
        with self._lock:
            if self._closed:
                raise ConnectionLost("client is closed")
            while self._idle:
                conn = self._idle.pop()
                if not conn.stale():
                    return conn
                conn.close()
        try:
            return _Connection(self.address, deadline)
        # refused, reset, a full backlog (timeout), or none left here (EMFILE)
        except OSError as exc:
            local = exc.errno in _LOCAL_ERRNOS
            where = "in this process" if local else f"to {self.address}"
            raise ConnectFailed(f"connect {where}: {exc!r}", local=local) from exc

    def _give_back(self, conn: _Connection) -> None:
        with self._lock:
            if not self._closed and not conn.buffer and len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def request(
        self,
        method: str,
        target: str,
        timeout: float,
        body: Sequence[bytes | memoryview] = (),
        headers: dict[str, str] | None = None,
    ) -> Answer:
        deadline = _Deadline(timeout)
        length = sum(memoryview(b).nbytes for b in body)
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = (
            f"{method} {target} HTTP/1.1\r\n{self._fixed}{extra}content-length: {length}\r\n\r\n"
        ).encode("latin-1")
        retrying = Retry(
            deadline.at,
            *RETRY_BACKOFF_S,
            retry_on=(ConnectFailed, _Evicted),
            # waiting gives no fds back
            retry_if=lambda exc: not (isinstance(exc, ConnectFailed) and exc.local),
            go_on=self._peer_alive,
            on_retry=self._count_retry,
        )
        try:
            return retrying.call(lambda: self._unevicted(head, body, deadline, method, target))
        except (ConnectFailed, _Evicted) as failure:
            if retrying.gave_up == "refused":
                raise
            raise ConnectFailed(
                f"{method} {target}: no connection served within {timeout} s, nothing was "
                f"read by the server ({failure})"
            ) from failure

    def _count_retry(self, failure: Exception, tries: int, pause: float) -> None:
        self.retries += 1

    def _unevicted(
        self,
        head: bytes,
        body: Sequence[bytes | memoryview],
        deadline: _Deadline,
        method: str,
        target: str,
    ) -> Answer:
        """One try's answer; an eviction by the child's connection gate (nothing was read)
        raises."""
        answer = self._once(head, body, deadline, method, target)
        if answer.status == 503 and EVICTED_HEADER in answer.headers:
            raise _Evicted(f"{method} {target}: evicted by the child's connection gate")
        return answer

    def _once(
        self,
        head: bytes,
        body: Sequence[bytes | memoryview],
        deadline: _Deadline,
        method: str,
        target: str,
    ) -> Answer:
        conn = self._take(deadline)
        try:
            answer, reusable = conn.exchange(head, body, deadline)
        except BaseException as exc:
            # mid-exchange (even on Ctrl-C) the connection's state is unknown: never reuse it
            conn.close()
            if isinstance(exc, (ConnectionLost, NoAnswer, BadAnswer)):
                raise
            if isinstance(exc, socket.timeout):
                raise NoAnswer(f"{method} {target}: no answer within {deadline.timeout} s") from exc
            if isinstance(exc, OSError):
                raise ConnectionLost(f"{method} {target}: {exc!r}") from exc  # reset, broken pipe
            raise
        if reusable:
            self._give_back(conn)
        else:
            conn.close()
        return answer

    def drop_idle(self) -> None:
        """Close the pooled idle connections: the next request opens a fresh one."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
