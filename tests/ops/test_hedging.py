"""Hedged chunks (issue 43, item 3): no server holds a step.

Three real `serve` processes of the probe (0.5 s a call); one is SIGSTOPped while it scores. Its
chunks are sent once more to the others past the p95 of the chunks seen so far, the first answer
wins and the stopped server's request is closed; the call ends long before its deadline with the
rewards one server gives. Beside it, the two parts it stands on: the delay (`Latencies`) and an
exchange ended from another thread (`bounded_http.Cancel`) on a real socket."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from scorers.common import bounded_http
from supervisor import MultiRemoteRewardBackend, RemoteRewardBackend
from supervisor.compose.hedging import HEDGES_WON, MIN_SAMPLES, WINDOW, Latencies
from supervisor.compose.remote_servers import _Call
from tests.conftest import eventually, wait_until_gone
from tests.ops.test_cli_serve import stop_serve
from tests.ops.test_remote_servers import EXPECTED, REQUEST, SIZE, SLOW, TOKEN, scoring, serve_many

DEADLINE_S = 60.0


def test_the_delay_is_the_p95_of_recent_latencies_and_a_quarter_of_the_deadline_before():
    latencies = Latencies(deadline_s=DEADLINE_S)
    for tenths in range(1, MIN_SAMPLES):
        latencies.add(tenths / 10)
        assert latencies.delay() == DEADLINE_S / 4  # too few to know what is slow
    latencies.add(1.0)
    assert latencies.delay() == 1.0  # the 95th percentile of 10 (nearest rank): the largest
    for hundredths in range(1, WINDOW + 1):
        latencies.add(hundredths / 100)
    assert latencies.delay() == 0.95  # the window holds the last WINDOW only
    latencies.count(won=False)
    latencies.count(won=True)
    stats = latencies.stats()
    assert (stats["hedges_sent"], stats["hedges_won"], stats["latency_samples"]) == (1, 1, WINDOW)


@contextmanager
def http_server() -> Iterator[tuple[str, threading.Event, list[str]]]:
    """A keep-alive HTTP/1.1 server: GET /now answers at once, GET /hang once `release` is set (or
    after 30 s); `seen` gets 'connection' per connection and 'hang' per /hang request."""
    release, seen = threading.Event(), []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            seen.append("connection")
            super().setup()

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/hang":
                seen.append("hang")
                release.wait(30)
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            return None

    class Server(ThreadingHTTPServer):
        def handle_error(self, request: object, client_address: object) -> None:
            seen.append("client gone")  # the cancelled /hang, answered into a closed socket

    server = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", release, seen
    finally:
        release.set()
        server.shutdown()
        server.server_close()
        thread.join(10)


def get(http: httpx.Client, path: str) -> bytes:
    return bounded_http.exchange(http, "GET", path, time.monotonic() + DEADLINE_S, 1024).body


def test_a_cancelled_exchange_ends_at_once_and_one_that_ended_leaves_its_connection_alone():
    with http_server() as (url, _, seen), bounded_http.client(url, base_url=True) as http:
        cancel, ended = bounded_http.Cancel(), []

        def hang() -> None:
            with cancel.scope(), pytest.raises(httpx.ReadError) as info:
                get(http, "/hang")
            ended.append(str(info.value))

        thread = threading.Thread(target=hang)
        thread.start()
        assert eventually(lambda: "hang" in seen)  # the server holds it
        cancel.cancel()
        thread.join(DEADLINE_S / 2)  # not the exchange's own 60 s deadline
        assert not thread.is_alive() and ended == [bounded_http.CANCELLED]
        with cancel.scope(), pytest.raises(httpx.ReadError, match=bounded_http.CANCELLED):
            get(http, "/now")  # a later exchange of the scope is never sent
        # an exchange that ended let go of its socket: a late cancel leaves the pooled connection
        # to the next exchange, which reuses it
        late = bounded_http.Cancel()
        with late.scope():
            assert get(http, "/now") == b"ok"
        late.cancel()
        assert get(http, "/now") == b"ok"
        assert seen.count("connection") == 2  # the cancelled one, then one for both /now


@pytest.mark.slow
def test_a_server_stopped_mid_call_holds_no_step_its_chunks_are_hedged(tmp_path: Path):
    """Without hedging the stopped server's chunk waits for the call's deadline (60 s) and fails
    it; hedged, the call ends in a few seconds with every reward one server gives, the stopped
    server is not counted as failed, and SIGCONT plus cleanup leave no process."""
    made = serve_many(tmp_path, [SLOW, SLOW, SLOW])
    victim, urls = made[1][0], [url for _, url in made]
    try:
        with RemoteRewardBackend(urls[0], token=TOKEN, request_batch_size=SIZE) as one:
            alone = one.compute_rewards(REQUEST)
        assert alone.rewards == EXPECTED
        with MultiRemoteRewardBackend(
            urls, token=TOKEN, request_batch_size=SIZE, request_timeout=DEADLINE_S
        ) as many:
            for _ in range(2):  # 6 chunks a call: the delay is the p95 of what was seen
                assert many.compute_rewards(REQUEST).rewards == EXPECTED
            before = many.stats()
            assert before["latency_samples"] >= MIN_SAMPLES
            assert before["hedge_delay_s"] < DEADLINE_S / 8
            outcome: list[object] = []
            began = time.monotonic()
            call = threading.Thread(target=lambda: outcome.append(score(many)))
            call.start()
            scoring(urls)  # every server is scoring its share's first chunk
            victim.send_signal(signal.SIGSTOP)
            call.join(DEADLINE_S + 30)
            took = time.monotonic() - began
            assert not call.is_alive() and len(outcome) == 1
            response = outcome[0]
            assert not isinstance(response, BaseException), response
            assert took < DEADLINE_S / 2, took  # hedged: not held to the deadline
            assert response.ids == alone.ids and response.rewards == alone.rewards
            assert response.component_rewards == alone.component_rewards
            after = many.stats()
            sent = after["hedges_sent"] - before["hedges_sent"]
            won = after["hedges_won"] - before["hedges_won"]
            assert 1 <= won <= sent, after  # its chunk(s), and at most what a noisy machine adds
            # the call's own hedges, in its response's diagnostics (counts: a step adds them up)
            values = response.diagnostics["probe"]["values"]
            assert 1 <= values["runtime.hedges_won"] <= values["runtime.hedges_sent"] <= sent
            assert after["passed_over"] == []  # it lost the race: it did not fail
    finally:
        victim.send_signal(signal.SIGCONT)
        for process, _ in made:
            assert stop_serve(process) == 0
        assert wait_until_gone([process.pid for process, _ in made], 10) == []


@pytest.mark.slow
def test_a_hedge_with_every_other_server_lagging_looks_again_until_one_answers(tmp_path: Path):
    """Two servers, both SIGSTOPped. B's chunk is hedged to A; then A's chunk finds every other
    server lagging: no hedge yet, and it looks again (`RETARGET_S`, the delay) instead of waiting
    for the deadline. Once B runs again and answers, A's chunk is hedged to B and won there, while A
    stays stopped; neither server is marked down for losing."""
    made = serve_many(tmp_path, [SLOW, SLOW])
    (a, _), (b, _) = made
    latencies = Latencies(deadline_s=DEADLINE_S)
    for _ in range(MIN_SAMPLES):
        latencies.add(0.1)  # the delay: 0.1 s
    went_down: list[tuple[int, str]] = []
    answers: dict[int, object] = {}
    chunks = {0: REQUEST.items[:SIZE], 1: REQUEST.items[SIZE : 2 * SIZE]}
    try:
        with MultiRemoteRewardBackend([url for _, url in made], token=TOKEN) as many:
            call = _Call(
                many.servers,
                [0, 1],
                time.monotonic() + DEADLINE_S,
                lambda index, why: went_down.append((index, why)),
                latencies,
            )

            def race(index: int) -> None:
                try:
                    answers[index] = call.score_chunk(index, chunks[index], None)
                except Exception as exc:  # noqa: BLE001 - handed to the test
                    answers[index] = exc

            a.send_signal(signal.SIGSTOP)
            b.send_signal(signal.SIGSTOP)
            began = time.monotonic()
            threads = [threading.Thread(target=race, args=(index,)) for index in (1, 0)]
            threads[0].start()
            assert eventually(lambda: latencies.stats()["hedges_sent"] == 1)  # B's chunk, to A
            threads[1].start()
            assert eventually(lambda: latencies.stats()["hedges_deferred"] == 1)  # A's: nowhere
            b.send_signal(signal.SIGCONT)
            for thread in threads:
                thread.join(DEADLINE_S / 2)
            took = time.monotonic() - began
            assert not any(thread.is_alive() for thread in threads)
            stats = latencies.stats()
    finally:
        for process, _ in made:
            process.send_signal(signal.SIGCONT)
            assert stop_serve(process) == 0
        assert wait_until_gone([process.pid for process, _ in made], 10) == []
    for index, chunk in chunks.items():
        answer = answers[index]
        assert not isinstance(answer, BaseException), answer
        assert list(answer.terms["probe"]) == [float(len(item.text or "")) for item in chunk]
    assert took < DEADLINE_S / 4, took
    # both chunks hedged; A's won on B; B's own send answered first (its hedge sits on stopped A)
    assert (stats["hedges_sent"], stats["hedges_won"], stats["hedges_deferred"]) == (2, 1, 1)
    assert went_down == [] and call.hedges()[HEDGES_WON] == 1


def score(backend: MultiRemoteRewardBackend) -> object:
    try:
        return backend.compute_rewards(REQUEST)
    except Exception as exc:  # noqa: BLE001 - handed to the test
        return exc
