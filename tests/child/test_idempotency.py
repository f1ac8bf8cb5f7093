"""Idempotent retries: a re-sent /score with the same key is answered, never scored twice;
RemoteRewardBackend retries only what may be retried, within the first try's deadline."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

from child_runtime.idempotency import AnswerCache, IdempotencyConflict
from child_runtime.protocol import wire
from supervisor import (
    RemoteRewardBackend,
    RewardItem,
    RewardRequest,
    ScorerError,
    ScorerRequestError,
)
from supervisor.child.client import ScorerClient
from supervisor.errors import ErrorStatus
from tests.conftest import run_in_threads, wait_in_flight

FIXTURES = "tests.helpers.fixture_scorers"
REQUEST = RewardRequest(items=[RewardItem(id=f"r{i}", text=f"t{i}") for i in range(3)])


def as_frame(items: list[RewardItem]) -> wire.Frame:
    return wire.prepare({"items": [item.to_wire() for item in items]})


def frame(*texts: str) -> wire.Frame:
    return as_frame([RewardItem(id=f"s{i}", text=t) for i, t in enumerate(texts)])


def client_for(backend) -> ScorerClient:
    return ScorerClient.remote(
        f"http://127.0.0.1:{backend._child.port}", backend._child.token, 30.0
    )


def journal(tmp_path: Path, managed, python, sleep_s: float = 0.0):
    path = tmp_path / "journal"
    return managed(
        python, f"{FIXTURES}:Journal", params={"path": str(path), "sleep_s": sleep_s}
    ), path


def scored(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def plain(answer: dict) -> dict:
    """A decoded answer with its float64 arrays as lists, so that answers compare with ==."""
    return {**answer, "terms": {name: values.tolist() for name, values in answer["terms"].items()}}


# -- the child's cache, over real HTTP ---------------------------------------------------------
def test_a_resent_score_with_the_same_key_is_answered_not_scored_again(
    managed, trainer_python, tmp_path
):
    backend, path = journal(tmp_path, managed, trainer_python)
    client = client_for(backend)
    try:
        first = plain(client.score(frame("a", "b"), "key-1"))
        assert not client.last_replayed
        again = plain(client.score(frame("a", "b"), "key-1"))
        assert client.last_replayed and again == first
        assert scored(path) == ["s0", "s1"]
        client.score(frame("a", "b"), "key-2")  # another key: another request, scored
        assert not client.last_replayed and scored(path) == ["s0", "s1"] * 2
        client.score(frame("a", "b"))  # no key: always scored
        assert scored(path) == ["s0", "s1"] * 3
        assert backend.health()["idempotency"] == {"entries": 2, "replays": 1}
        # the managed backend's own loopback client sends a key too
        backend.compute_rewards(REQUEST)
        assert backend.health()["idempotency"] == {"entries": 3, "replays": 1}
    finally:
        client.close()


def test_the_same_key_for_a_different_body_is_a_conflict(managed, trainer_python, tmp_path):
    backend, path = journal(tmp_path, managed, trainer_python)
    client = client_for(backend)
    try:
        client.score(frame("a"), "key-1")
        with pytest.raises(ErrorStatus) as info:
            client.score(frame("b"), "key-1")
        assert (info.value.status, info.value.kind) == (422, "idempotency_conflict")
        assert scored(path) == ["s0"]
    finally:
        client.close()


@pytest.mark.parametrize("key", [b"k" * 201, b"", b"caf\xc3\xa9", b"tab\there"])
def test_a_bad_key_is_refused(managed, trainer_python, tmp_path, key):
    backend, path = journal(tmp_path, managed, trainer_python)
    headers = {"authorization": f"Bearer {backend._child.token}", "idempotency-key": key}
    with httpx.Client(
        base_url=f"http://127.0.0.1:{backend._child.port}", trust_env=False, timeout=10
    ) as http:
        answer = http.post("/score", content=b"".join(frame("a").body_parts()), headers=headers)
    assert (answer.status_code, answer.json()["kind"]) == (400, "bad_request")
    assert scored(path) == [] and backend.health()["state"] == "ready"


def test_a_failed_scoring_is_not_cached(managed, trainer_python, tmp_path):
    backend, path = journal(tmp_path, managed, trainer_python)
    client = client_for(backend)
    try:
        for _ in range(2):
            with pytest.raises(ErrorStatus) as info:
                client.score(frame("raise"), "key-1")
            assert info.value.status == 500
        assert scored(path) == ["s0", "s0"]
        assert backend.health()["idempotency"] == {"entries": 0, "replays": 0}
    finally:
        client.close()


def test_a_duplicate_sent_while_the_first_is_scored_waits_for_it(managed, trainer_python, tmp_path):
    backend, path = journal(tmp_path, managed, trainer_python, sleep_s=1.5)
    clients = [client_for(backend), client_for(backend)]
    answers: dict[int, tuple[object, bool]] = {}

    def send(n: int) -> None:
        if n == 1:
            wait_in_flight(backend)  # the first is being scored
        answers[n] = (
            plain(clients[n].score(frame("slow", "x"), "key-1")),
            clients[n].last_replayed,
        )

    try:
        run_in_threads(send, 2, timeout=30)
    finally:
        for client in clients:
            client.close()
    assert answers[0][0] == answers[1][0]
    assert (answers[0][1], answers[1][1]) == (False, True)
    assert scored(path) == ["s0", "s1"]


def test_the_managed_backend_sends_a_key_through_the_segment(managed, trainer_python):
    backend = managed(
        trainer_python, f"{FIXTURES}:TwoTermImage", "image", client={"shared_memory_min_bytes": 0}
    )
    request = RewardRequest(
        items=[RewardItem(id=f"i{i}", image=np.full((64, 64, 3), i, np.uint8)) for i in range(3)]
    )
    assert backend.compute_rewards(request).successes == [True] * 3
    assert backend.health()["idempotency"] == {"entries": 1, "replays": 0}
    client = backend._gen.client
    chunk = as_frame(request.items)
    assert client.uses_segment(chunk)
    first = plain(client.score(chunk, "key-1"))
    again = plain(client.score(chunk, "key-1"))
    assert client.last_replayed and again == first and first["terms"]["aesthetic"] == [0.9] * 3
    assert backend.health()["idempotency"] == {"entries": 2, "replays": 1}


def test_the_window_is_bounded_by_entries_age_and_bytes():
    now = [0.0]
    cache = AnswerCache(max_entries=2, ttl_s=10.0, max_bytes=100, clock=lambda: now[0])
    calls: list[str] = []

    async def answer(key: str, body: bytes = b"x" * 10) -> tuple[bytes, bool]:
        async def produce() -> bytes:
            calls.append(key)
            return body

        return await cache.answer(key, b"digest", produce)

    async def scenario() -> None:
        assert await answer("a") == (b"x" * 10, False) and await answer("a") == (b"x" * 10, True)
        await answer("b")
        await answer("c")  # three keys, room for two: 'a' is forgotten
        assert cache.entries == 2 and (await answer("a"))[1] is False
        now[0] = 11.0  # older than the TTL: all forgotten
        assert (await answer("c"))[1] is False and cache.entries == 1
        await answer("big", b"y" * 101)  # larger than all the room: answered, not kept
        assert cache.entries == 1 and (await answer("big", b"y" * 101))[1] is False
        await answer("d", b"z" * 95)  # the bytes bound pushes the older answer out
        assert cache.entries == 1 and (await answer("d", b"z" * 95))[1] is True
        with pytest.raises(IdempotencyConflict):
            await cache.answer("d", b"other digest", produce_nothing)

    async def produce_nothing() -> bytes:
        raise AssertionError("a conflict must not be scored")

    asyncio.run(scenario())
    assert calls == ["a", "b", "c", "a", "c", "big", "big", "d"]
    assert cache.replays == 2


# -- RemoteRewardBackend retries, through a loopback proxy that misbehaves ------------------------
def _read_message(stream) -> tuple[bytes, dict[str, str]] | None:
    """One HTTP/1.1 message with a content-length (or none) from a buffered socket file."""
    head = stream.readline(65536)
    if not head:
        return None
    while (line := stream.readline(65536)) not in (b"\r\n", b""):
        head += line
    lines = head.decode("latin-1").split("\r\n")[1:]
    headers = {
        name.strip().lower(): value.strip()
        for name, _, value in (line.partition(":") for line in lines if line)
    }
    body = stream.read(int(headers.get("content-length", "0")))
    return head + b"\r\n" + body, headers


class Proxy:
    """Forwards each request to the child on its own connection. `plan(n)` says what to do with
    the n-th /score: 'pass'; 'drop' (forward it, read the child's answer, close the client's
    connection instead of answering); 'hang' (never answer); or a status code to answer itself."""

    def __init__(self, upstream_port: int, plan: Callable[[int], str]) -> None:
        self.upstream_port, self.plan = upstream_port, plan
        self.scores: list[dict[str, str]] = []  # the headers of every /score that reached the proxy
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._spawn(self._accept)

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # the listener was closed: the test is over
                return
            with self._lock:
                self._sockets.append(conn)
            self._spawn(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        with self._lock:
            self._sockets.append(upstream)
        requests, answers = conn.makefile("rb"), upstream.makefile("rb")
        try:
            self._relay(conn, requests, upstream, answers)
        # either side closed or reset mid-message (close() does that): this connection is over
        except OSError:
            pass
        finally:  # the files hold the descriptors too: close them for the FIN to go out now
            for each in (requests, answers, conn, upstream):
                each.close()

    def _relay(self, conn, requests, upstream, answers) -> None:
        while (request := _read_message(requests)) is not None:
            raw, headers = request
            action = "pass"
            if raw.startswith(b"POST /score"):
                with self._lock:
                    self.scores.append(headers)
                    action = self.plan(len(self.scores) - 1)
            if action == "hang":
                conn.recv(1)  # until the client gives up and closes
                return
            if action.isdigit():
                body = b'{"error": "try later", "kind": "unavailable"}'
                conn.sendall(
                    f"HTTP/1.1 {action} Busy\r\ncontent-type: application/json\r\n"
                    f"content-length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                continue
            upstream.sendall(raw)
            answer = _read_message(answers)
            assert answer is not None, "the child closed the connection"
            if action == "drop":
                return  # the child has answered; the client never hears it
            conn.sendall(answer[0])

    def close(self) -> None:
        # wakes the accepting thread (close alone does not)
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:  # already closed by its thread
                    pass
            threads = list(self._threads)
        for thread in threads:
            thread.join(5)
        assert not any(thread.is_alive() for thread in threads), "a proxy thread outlived the test"


@pytest.fixture
def proxy():
    made: list[Proxy] = []

    def make(upstream, plan: Callable[[int], str]) -> Proxy:
        made.append(Proxy(upstream._child.port, plan))
        return made[-1]

    yield make
    for each in made:
        each.close()


def remote(server, proxy: Proxy, **kwargs) -> RemoteRewardBackend:
    return RemoteRewardBackend(
        f"http://127.0.0.1:{proxy.port}", token=server._child.token, **kwargs
    )


def test_an_answer_lost_on_the_way_back_is_fetched_again_not_scored_again(
    managed, trainer_python, tmp_path, proxy
):
    server, path = journal(tmp_path, managed, trainer_python)
    lossy = proxy(server, lambda n: "drop" if n == 0 else "pass")
    with remote(server, lossy) as backend:
        assert backend.compute_rewards(REQUEST).rewards == [1.0, 1.0, 1.0]
    assert scored(path) == ["r0", "r1", "r2"]
    keys = [headers["idempotency-key"] for headers in lossy.scores]
    assert len(keys) == 2 and keys[0] == keys[1] and len(keys[0]) == 32
    assert server.health()["idempotency"] == {"entries": 1, "replays": 1}


@pytest.mark.parametrize("status", ["429", "502", "503"])
def test_a_busy_answer_is_retried(managed, trainer_python, tmp_path, proxy, status):
    server, path = journal(tmp_path, managed, trainer_python)
    busy = proxy(server, lambda n: status if n < 2 else "pass")
    with remote(server, busy) as backend:
        assert backend.compute_rewards(REQUEST).rewards == [1.0, 1.0, 1.0]
    assert len(busy.scores) == 3 and scored(path) == ["r0", "r1", "r2"]


def test_a_4xx_is_never_retried(managed, trainer_python, proxy):
    server = managed(trainer_python, f"{FIXTURES}:TwoTermImage", "image")
    honest = proxy(server, lambda n: "pass")
    with (
        remote(server, honest) as backend,
        pytest.raises(ScorerRequestError, match="after 1 attempt:") as info,
    ):
        backend.compute_rewards(REQUEST)  # text items for an image scorer
    assert 400 <= info.value.status < 500 and info.value.status != 429
    assert len(honest.scores) == 1


@pytest.mark.parametrize("action", ["drop", "hang"])
def test_retries_end_at_the_first_tries_deadline(managed, trainer_python, tmp_path, proxy, action):
    server, path = journal(tmp_path, managed, trainer_python)
    broken = proxy(server, lambda n: action)
    with remote(server, broken, request_timeout=2.0, max_retries=100) as backend:
        started = time.monotonic()
        with pytest.raises(
            ScorerError, match=r"score at http://127\.0\.0\.1:\d+ after \d+ attempts?"
        ) as info:
            backend.compute_rewards(REQUEST)
        elapsed = time.monotonic() - started
    assert elapsed < 3.0, f"gave up after {elapsed:.2f} s, well past the 2 s deadline"
    assert not isinstance(info.value, ScorerRequestError)
    attempts = len(broken.scores)
    assert f"after {attempts} attempt" in str(info.value)
    # each try reached the child; it scored once and answered the rest from its cache
    if action == "drop":
        assert attempts >= 3 and scored(path) == ["r0", "r1", "r2"]
    else:  # one try took the whole deadline: no time left for another
        assert attempts == 1 and elapsed > 1.9 and scored(path) == []
