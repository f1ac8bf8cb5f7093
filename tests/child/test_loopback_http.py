"""LoopbackHTTP against real sockets: deadlines across the whole exchange, stale connections,
framing."""

from __future__ import annotations

import hashlib
import socket
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from child_runtime.gate import EVICTION
from supervisor.child.loopback_http import LoopbackHTTP
from supervisor.errors import BadAnswer, ConnectFailed, ConnectionLost, NoAnswer
from tests.conftest import run_in_threads


class RawServer:
    """A one-thread TCP server whose `handle(conn)` plays a (mis)behaving HTTP peer."""

    def __init__(self, handle: Callable[[socket.socket], None]) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        self._handle = handle
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            try:
                self._handle(conn)
            except OSError:
                pass

    def close(self) -> None:
        try:
            # wakes the blocked accept(); close() alone does not
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        self._thread.join(5)
        assert not self._thread.is_alive()


def read_request(conn: socket.socket) -> tuple[bytes, bytes]:
    """Head and body of one request (content-length framed)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("client went away")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(
        [
            line.split(b":")[1]
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        ][0]
    )
    while len(body) < length:
        body += conn.recv(1 << 20)
    return head, body


def answer(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), extra, body)


@pytest.fixture
def serve():
    servers = []

    def start(handle: Callable[[socket.socket], None]) -> tuple[RawServer, LoopbackHTTP]:
        server = RawServer(handle)
        client = LoopbackHTTP("127.0.0.1", server.port, {"authorization": "Bearer t"})
        servers.append((server, client))
        return server, client

    yield start
    for server, client in servers:
        client.close()
        server.close()


def keep_alive(reply: Callable[[bytes, bytes], bytes]) -> Callable[[socket.socket], None]:
    """A handler answering every request on the connection with `reply(head, body)`."""

    def handle(conn: socket.socket) -> None:
        while True:
            try:
                head, body = read_request(conn)
            except ConnectionError:
                return
            conn.sendall(answer(reply(head, body)))

    return handle


keep_alive_echo = keep_alive(lambda head, body: hashlib.sha256(body).hexdigest().encode())


def test_keep_alive_reuses_one_connection_and_scatter_gather_arrives_intact(serve):
    server, client = serve(keep_alive_echo)
    arrays = [
        np.random.default_rng(i).integers(0, 256, (512, 512, 3), dtype=np.uint8) for i in range(8)
    ]
    parts = [b"head"] + [memoryview(a.reshape(-1)) for a in arrays] + [b"", b"tail"]
    expected = (
        hashlib.sha256(b"head" + b"".join(a.tobytes() for a in arrays) + b"tail")
        .hexdigest()
        .encode()
    )
    for _ in range(5):
        reply = client.request("POST", "/score", 10.0, parts)
        assert reply.status == 200 and bytes(reply.body) == expected
    assert server.accepted == 1


def test_a_silent_server_times_out_at_the_deadline(serve):
    def silent(conn: socket.socket) -> None:
        read_request(conn)
        time.sleep(3)

    _, client = serve(silent)
    started = time.monotonic()
    with pytest.raises(NoAnswer):
        client.request("GET", "/health", 0.5)
    assert 0.45 < time.monotonic() - started < 1.5


def test_the_deadline_spans_the_whole_answer_not_each_read(serve):
    """A server dripping one byte every 0.1 s never lets a single recv time out; the deadline still
    holds."""

    def drip(conn: socket.socket) -> None:
        read_request(conn)
        for byte in answer(b"x" * 100):
            conn.sendall(bytes([byte]))
            time.sleep(0.1)

    _, client = serve(drip)
    started = time.monotonic()
    with pytest.raises(NoAnswer):
        client.request("GET", "/health", 1.0)
    assert time.monotonic() - started < 1.6


@pytest.mark.parametrize(
    "reply, error, message",
    [
        (b"", ConnectionLost, "closed the connection before answering"),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\nshort",
            ConnectionLost,
            "after 5 of 50 body bytes",
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            BadAnswer,
            "no content-length",
        ),
        (b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n", BadAnswer, "expected HTTP/1.1"),
        (b"garbage\r\n\r\n", BadAnswer, "bad status line"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", BadAnswer, "bad header line"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n", BadAnswer, "bad content-length"),
        (
            "HTTP/1.1 200 OK\r\ncontent-length: \u00b2\r\n\r\n".encode("latin-1"),
            BadAnswer,
            "bad content-length",
        ),
    ],
)
def test_broken_answers_are_typed(serve, reply, error, message):
    def broken(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(reply)

    _, client = serve(broken)
    with pytest.raises(error, match=message):
        client.request("GET", "/health", 5.0)


def test_a_connection_the_server_closed_while_idle_is_replaced(serve):
    """The server answers once per connection and hangs up without saying so: never reuse a dead
    socket."""
    hung_up = threading.Event()

    def one_shot(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(answer(b"ok"))
        conn.close()
        hung_up.set()

    server, client = serve(one_shot)
    for _ in range(4):
        assert bytes(client.request("GET", "/health", 5.0).body) == b"ok"
        assert hung_up.wait(5)  # the server has closed before the next request goes out
        hung_up.clear()
    assert server.accepted == 4


def test_connection_close_answers_are_not_reused(serve):
    def closes(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(answer(b"bye", b"connection: close\r\n"))

    server, client = serve(closes)
    for _ in range(3):
        assert bytes(client.request("GET", "/health", 5.0).body) == b"bye"
    assert server.accepted == 3


def test_refused_connection_and_closed_client(serve):
    server, client = serve(keep_alive_echo)
    server.close()
    started = time.monotonic()
    with pytest.raises(ConnectFailed, match="connect to"):  # nobody alive behind the port: at once
        LoopbackHTTP("127.0.0.1", server.port, {}).request("GET", "/health", 2.0)
    assert time.monotonic() - started < 0.5
    client.close()
    with pytest.raises(ConnectionLost, match="client is closed"):
        client.request("GET", "/health", 2.0)


def test_threads_share_the_client_without_mixing_answers(serve):
    server, client = serve(keep_alive(lambda head, body: head.split(b" ")[1]))
    failures: list[str] = []

    def worker(n: int) -> None:
        for i in range(100):
            path = f"/t{n}/{i}"
            got = bytes(client.request("GET", path, 10.0).body).decode()
            if got != path:
                failures.append(f"{path} -> {got}")

    run_in_threads(worker, 6)
    assert failures == []
    assert server.accepted <= 6  # connections are pooled, not one per request


def test_a_refused_connect_to_a_live_peer_is_retried_until_the_deadline(serve):
    """Nothing was sent, so trying again is safe; while the peer lives, the deadline decides."""
    server, _ = serve(keep_alive_echo)
    server.close()
    client = LoopbackHTTP("127.0.0.1", server.port, {}, peer_alive=lambda: True)
    started = time.monotonic()
    with pytest.raises(ConnectFailed, match="no connection served within 0.6 s, nothing was read"):
        client.request("GET", "/health", 0.6)
    assert 0.45 < time.monotonic() - started < 1.5 and client.retries >= 3


def test_an_eviction_by_the_childs_gate_is_retried_on_a_fresh_connection(serve):
    """The gate answers 503 with its header before it reads the request: the request was not acted
    on."""
    evictions = []

    def evict_twice(conn: socket.socket) -> None:
        if len(evictions) < 2:
            evictions.append(1)
            conn.sendall(EVICTION)
            return
        keep_alive_echo(conn)

    server, _ = serve(evict_twice)
    client = LoopbackHTTP("127.0.0.1", server.port, {}, peer_alive=lambda: True)
    reply = client.request("POST", "/score", 5.0, [b"payload"])
    assert reply.status == 200 and client.retries == 2 and server.accepted == 3


def test_an_ordinary_503_is_an_answer_not_a_retry(serve):
    def busy(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nbusy")

    server, _ = serve(busy)
    client = LoopbackHTTP("127.0.0.1", server.port, {}, peer_alive=lambda: True)
    assert client.request("GET", "/health", 5.0).status == 503 and client.retries == 0


def test_an_eviction_while_a_large_body_is_still_being_sent_is_retried(serve):
    """The gate answers before it reads anything and drains what keeps coming: the sender finishes
    its body, reads the eviction, and sends again on a fresh connection (no reset mid-send)."""
    evicted = []

    def evict_then_drain(conn: socket.socket) -> None:
        if evicted:
            return keep_alive_echo(conn)
        evicted.append(1)
        conn.sendall(EVICTION)
        conn.settimeout(5)
        while conn.recv(1 << 20):
            pass

    server, _ = serve(evict_then_drain)
    client = LoopbackHTTP("127.0.0.1", server.port, {}, peer_alive=lambda: True)
    body = np.zeros(20 << 20, np.uint8)
    reply = client.request("POST", "/score", 10.0, [memoryview(body)])
    assert reply.status == 200 and bytes(reply.body) == hashlib.sha256(body).hexdigest().encode()
    assert client.retries == 1
