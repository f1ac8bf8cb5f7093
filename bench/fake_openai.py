"""A fake OpenAI-compatible chat-completions server on loopback, for the judge's failure matrix.

The behaviour is asked for inside the judged text, so one server serves a whole matrix:
`[[score:7]]` answers "Score: 7" (default: a score derived from the text), `[[choice:A]]`
answers "Verdict: A", `[[slow:3]]` waits 3 s first, `[[status:429]]` answers that status,
`[[malformed]]` a truncated JSON body, `[[drop]]` closes the connection without an answer,
`[[unparsable]]` a reply with no score, `[[trickle:0.5]]` sends the body a byte every 0.5 s,
`[[echo_auth]]` a 401 that repeats the Authorization header it got, `[[trickle_headers:0.3]]` a
status line and headers a byte every 0.3 s that never end.
`xN` after a directive limits it to the first N attempts of that exact request body
(`[[status:500x2]]`), so a retry that changes the request would be seen. Stdlib only.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from bench.loopback_server import LoopbackServer, send_answer

DIRECTIVE = re.compile(r"\[\[([a-z_]+)(?::([^\]x]*))?(?:x(\d+))?\]\]")


@dataclass(frozen=True)
class Seen:
    at: float
    body: bytes
    authorization: str | None


class FakeOpenAI(LoopbackServer):
    """`with FakeOpenAI() as server:` serves on 127.0.0.1 at `server.base_url` until the block
    ends."""

    def __init__(self) -> None:
        self.requests: list[Seen] = []
        self.attempts: Counter[str] = Counter()
        self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()
        super().__init__(_handler(self), "fake-openai")
        self.base_url = f"{self.url}/v1"

    def seen(self, body: bytes) -> int:
        with self._lock:
            key = hashlib.sha256(body).hexdigest()
            self.attempts[key] += 1
            return self.attempts[key]

    def bodies_with(self, marker: str) -> list[bytes]:
        """Every request body received whose text contains `marker` (retries included)."""
        return [seen.body for seen in self.requests if marker.encode() in seen.body]


def _directives(text: str, attempt: int) -> dict[str, str]:
    """The directives in force for this attempt: `name -> argument` ('' when it has none)."""
    return {
        name: argument or ""
        for name, argument, limit in DIRECTIVE.findall(text)
        if not limit or attempt <= int(limit)
    }


def default_score(text: str) -> int:
    return sum(text.encode()) % 11


def _misbehaved(handler: Any, does: dict[str, str]) -> bool:
    """Whatever a directive makes the server do instead of answering (drop, a status, garbage)."""
    if "drop" in does:
        handler.connection.shutdown(socket.SHUT_RDWR)
        handler.close_connection = True
    elif "echo_auth" in does:  # a careless server that repeats the credential in its error
        handler._send(
            401, json.dumps({"error": f"bad key {handler.headers.get('authorization')}"}).encode()
        )
    elif "status" in does:
        headers = {"retry-after": does["retry_after"]} if "retry_after" in does else {}
        handler._send(int(does["status"]), b'{"error": {"message": "fake failure"}}', headers)
    elif "malformed" in does:
        handler._send(200, b'{"choices": [{"message": {"content": "Score: 1')
    else:
        return False
    return True


def _reply(does: dict[str, str], text: str) -> str:
    """The judge's answer: a score, a verdict, or nothing it could parse."""
    if "unparsable" in does:
        return "I would rather not say."
    if "choice" in does:
        return f"Both are fine.\nVerdict: {does['choice']}"
    return f"A fair answer.\nScore: {does.get('score') or default_score(text)}"


def _handler(server: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
            """Quiet: the tests read what the server recorded instead."""

        _does: dict[str, str] = {}

        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            with server._lock:
                server.requests.append(
                    Seen(time.monotonic(), body, self.headers.get("authorization"))
                )
                server.in_flight += 1
                server.max_in_flight = max(server.max_in_flight, server.in_flight)
            try:
                self._answer(body)
            # the client gave up at its deadline: expected
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True
            finally:
                with server._lock:
                    server.in_flight -= 1

        def _answer(self, body: bytes) -> None:
            if self.path != "/v1/chat/completions":
                self._send(404, b'{"error": {"message": "no such route"}}')
                return
            attempt = server.seen(body)
            request = json.loads(body)
            text = request["messages"][-1]["content"]
            does = self._does = _directives(text, attempt)
            if "slow" in does:
                time.sleep(float(does["slow"]))
            if _misbehaved(self, does):
                return
            reply = _reply(does, text)
            answer = {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "model": request.get("model"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": reply},
                        "finish_reason": "stop",
                    }
                ],
            }
            self._send(
                200,
                json.dumps(answer).encode(),
                trickle=float(does["trickle"]) if "trickle" in does else 0.0,
            )

        def _send(
            self,
            status: int,
            payload: bytes,
            headers: dict[str, str] | None = None,
            trickle: float = 0,
        ) -> None:
            # a byte of the status line every so often, never finishing
            if "trickle_headers" in self._does:
                for byte in (
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-slow: " + b"a" * 10_000
                ):
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(float(self._does["trickle_headers"]))
            send_answer(self, status, "application/json", payload, headers, trickle)

    return Handler
