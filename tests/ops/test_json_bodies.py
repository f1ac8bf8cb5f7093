"""serve's OpenRLHF route parses its JSON bodies within bounds
(child_runtime/protocol/bounded_json): a body cap refused before it is read, the parse off the event
loop (/health answered meanwhile), peak memory at most (PARSE_FACTOR + 1) x the cap whatever the
body holds, a 400 for nesting and invalid JSON with a short message, and error lines on the log said
once per kind and interval, not once per request."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from child_runtime.protocol import bounded_json
from supervisor.config import LimitsConfig
from tests.conftest import eventually, wait_until_gone
from tests.ops.test_cli_serve import FLAKY, start_serve, stop_serve, wait_ready

CAP = LimitsConfig().openrlhf_max_request_bytes  # the route's default cap: 16 MiB
BUDGET = bounded_json.PARSE_FACTOR * CAP
BEARER = {"authorization": "Bearer " + "t" * 32}


class Served:
    def __init__(self, port: int, secret: str, pid: int, log: Path) -> None:
        self.base, self.route, self.pid, self.log = (
            f"http://127.0.0.1:{port}",
            f"/openrlhf/{secret}",
            pid,
            log,
        )
        self.port = port

    def post(self, body: bytes, timeout: float = 120) -> httpx.Response:
        return httpx.post(self.base + self.route, content=body, timeout=timeout)

    def health(self) -> dict[str, Any]:
        return httpx.get(self.base + "/health", headers=BEARER, timeout=30).json()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("json-bodies")
    secret_file = tmp / "openrlhf-secret"
    server, ready, log = start_serve(
        tmp, "flaky", *FLAKY, "--openrlhf-secret-file", str(secret_file)
    )
    try:
        info = wait_ready(ready)
        yield Served(info["port"], secret_file.read_text().strip(), info["pid"], log)
        assert stop_serve(server) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert wait_until_gone([server.pid], 10) == []


def request(label: Any, text: str = "P x") -> bytes:
    return json.dumps({"query": [text], "prompts": ["P"], "labels": [label]}).encode()


def repeated_to_the_bound(unit: bytes, head: bytes = b"[", tail: bytes = b"0]") -> bytes:
    """`head + unit * n + tail` with the largest n whose price is within the route's parse
    budget."""
    low, high = 1, CAP // len(unit)
    while low < high:
        middle = (low + high + 1) // 2
        if bounded_json.price(head + unit * middle + tail)[0] <= BUDGET:
            low = middle
        else:
            high = middle - 1
    body = head + unit * low + tail
    # at the bound, not below it
    assert bounded_json.price(body)[0] > BUDGET - bounded_json.UNIT_BYTES * 8
    return body


def string_to_the_bound(ending: str, width: int) -> bytes:
    """One string of ASCII and `ending`, as long as the parse budget allows: the body decodes at
    `width` bytes a character, or (an escape) its string does."""
    fill = (BUDGET - 64 * bounded_json.UNIT_BYTES) // (
        1 + 2 * width if ending.startswith("\\") else 2 * width
    )
    body = ('["' + "a" * fill + ending + '"]').encode()
    priced = bounded_json.price(body)[0]
    assert BUDGET * 0.99 < priced <= BUDGET, (priced, BUDGET)
    return body


def peak_growth(served: Served, body: bytes) -> tuple[int, int]:
    """(the server's peak RSS growth while it reads and parses `body`, the answer's status): the
    peak from the kernel's high-water mark, reset just before."""
    Path(f"/proc/{served.pid}/clear_refs").write_text("5")  # VmHWM := the RSS now
    before = psutil.Process(served.pid).memory_info().rss
    status = served.post(body).status_code
    status_lines = Path(f"/proc/{served.pid}/status").read_text().splitlines()
    peak = next(int(line.split()[1]) * 1024 for line in status_lines if line.startswith("VmHWM:"))
    return peak - before, status


@pytest.mark.slow
def test_peak_memory_is_at_most_the_stated_factor_of_the_cap_whatever_the_body_holds(served):
    worst = {
        "one string, ASCII but one \\ud83d escape: 4 bytes a character": (
            string_to_the_bound("\\ud83d\\ude00", 4),
            400,
        ),
        "one string of raw UTF-8 with one 4-byte character": (
            string_to_the_bound("\U0001f600", 4),
            400,
        ),
        "one-member objects, the most bytes per value": (repeated_to_the_bound(b'{"a":0},'), 400),
        "zeros": (repeated_to_the_bound(b"0,"), 400),
        "empty objects up to the cap (json.loads: ~26 x the body)": (
            b"[" + b"{}," * (CAP // 3 - 1) + b"{}]",
            413,
        ),
    }
    factor = bounded_json.PARSE_FACTOR + 1
    for name, (body, status) in worst.items():
        growth, answered = peak_growth(served, body)
        assert growth <= factor * CAP, f"{name}: peak growth {growth / CAP:.2f} x the cap"
        assert answered == status, name
    assert served.health()["state"] == "ready"


@pytest.mark.slow
def test_health_is_answered_while_a_big_body_is_parsed_off_the_event_loop(served):
    body = repeated_to_the_bound(
        b"0,", head=b'{"query": ["P ab"], "prompts": ["P"], "labels": [[', tail=b"0]]}"
    )
    answered: list[httpx.Response] = []
    poster = threading.Thread(target=lambda: answered.append(served.post(body)))
    poster.start()
    try:
        seen_parsing = []
        while poster.is_alive() and len(seen_parsing) < 3:
            if served.health()["json_parsing"] == 1:
                # /health answered while the parse of the body was running
                seen_parsing.append(True)
    finally:
        poster.join(120)
    assert len(seen_parsing) == 3
    # then scored as usual
    assert answered[0].status_code == 200 and answered[0].json()["rewards"] == 2.0


def test_nesting_invalid_json_and_bodies_past_the_cap_are_refused_with_a_short_message(served):
    refusals = {
        # +2: the
        request(json.loads("[" * 63 + "]" * 63)): (400, "nests arrays and objects deeper than 64"),
        # request object and its labels list
        b'{"query": ["P a"], "labels": [' + b"[" * 5000 + b"]" * 5000 + b"]}": (
            400,
            "deeper than 64",
        ),
        b"{not json": (400, "the body is not JSON: Expecting property name"),
        b'{"query": ["P \xff"]}': (400, "the body is not UTF-8"),
        b"[" + b"0," * (CAP // 2 - 2) + b"0]": (413, "could take ~"),
        b" " * (CAP + 1): (413, f"exceeds openrlhf_max_request_bytes={CAP}"),
    }
    for body, (status, why) in refusals.items():
        answer = served.post(body)
        assert answer.status_code == status, (status, answer.text[:300])
        error = answer.json()["error"]
        assert why in error, error
        assert "Traceback" not in error and ".py" not in error and len(error) < 400, error
    ok = served.post(request(json.loads("[" * 62 + "]" * 62)))  # 64 deep in all
    assert ok.status_code == 200 and ok.json()["rewards"] == 1.0


def test_a_declared_body_past_the_cap_is_refused_before_it_is_sent(served):
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as sock:
        head = f"POST {served.route} HTTP/1.1\r\nhost: x\r\ncontent-length: {CAP + 1}\r\n\r\n"
        sock.sendall(head.encode() + b"{")  # one byte of the body, the rest never comes
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < _length(answer):
            chunk = sock.recv(65536)  # the headers and the body may come in separate segments
            if not chunk:
                break
            answer += chunk
    answer = answer.decode()
    assert (
        answer.startswith("HTTP/1.1 413") and f"exceeds openrlhf_max_request_bytes={CAP}" in answer
    )


def test_error_answers_are_logged_once_per_kind_and_interval(served):
    def lines(kind: str) -> list[str]:
        return [
            line
            for line in served.log.read_text().splitlines()
            if f" ERROR child_runtime.openrlhf: answered {kind}" in line
        ]

    said = {kind: len(lines(kind)) for kind in ("400 bad_request", "500 scorer_error")}
    for _ in range(12):
        assert served.post(b"[1,").status_code == 400
    assert served.post(request(None, "P raise")).status_code == 500
    # another kind: at once
    assert eventually(lambda: len(lines("500 scorer_error")) == said["500 scorer_error"] + 1)
    # 12 answers: at most one line
    assert len(lines("400 bad_request")) <= said["400 bad_request"] + 1
    assert "x1 (OpenRLHF retries 5 times" in lines("500 scorer_error")[-1]


def _length(head: bytes) -> int:
    """The content-length an answer's headers declare (0 until they are all in, or without one)."""
    for line in head.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0
