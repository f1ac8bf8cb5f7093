"""A fake OpenAI chat endpoint with limits of its own, on loopback: what a shared judge API does.

It counts requests in flight and arrivals, and answers 429 (with a Retry-After) to a request past
its `concurrency` or past `per_second` arrivals in the trailing second. A request it serves waits
`base_s + per_load_s * in_flight` (so latency rises with load), then answers "Score: 7" with a
`usage` of `usage_tokens`. A request counts as in flight from its arrival until its answer is about
to be written, so a client that releases its slot once it has the answer can never make the count
pass the number of slots. `capacity` may be changed while it serves. Stdlib only.
"""

from __future__ import annotations

import bisect
import json
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from bench.loopback_server import LoopbackServer, send_answer


class LimitedOpenAI(LoopbackServer):
    def __init__(
        self,
        concurrency: int | None = None,
        per_second: int | None = None,
        base_s: float = 0.05,
        per_load_s: float = 0.0,
        usage_tokens: int = 40,
    ) -> None:
        self.concurrency, self.per_second = concurrency, per_second
        self.base_s, self.per_load_s, self.usage_tokens = base_s, per_load_s, usage_tokens
        self.arrivals: list[float] = []
        self.in_flight = self.peak_in_flight = self.throttled = self.answered = 0
        self._lock = threading.Lock()
        super().__init__(_handler(self), "limited-openai", poll_s=0.1)
        self.base_url = f"{self.url}/v1"

    def peak_per_second(self) -> int:
        """The most arrivals in any one-second window."""
        times = sorted(self.arrivals)
        return max(
            (bisect.bisect_right(times, t + 1.0) - i for i, t in enumerate(times)), default=0
        )

    def admit(self) -> float | None:
        """Count an arrival; the seconds to serve it, or None to refuse it (429)."""
        now = time.monotonic()
        with self._lock:
            self.arrivals.append(now)
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            recent = len(self.arrivals) - bisect.bisect_right(self.arrivals, now - 1.0)
            if (self.concurrency is not None and self.in_flight > self.concurrency) or (
                self.per_second is not None and recent > self.per_second
            ):
                self.throttled += 1
                self.in_flight -= 1
                return None
            return self.base_s + self.per_load_s * self.in_flight

    def done(self) -> None:
        with self._lock:
            self.in_flight -= 1
            self.answered += 1


def _handler(server: LimitedOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
            """Quiet: the tests read the counts."""

        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            request = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
            serve_s = server.admit()
            if serve_s is None:
                body = b'{"error": {"message": "rate limited", "type": "rate_limit"}}'
                send_answer(self, 429, "application/json", body, {"retry-after": "0.2"})
                return
            time.sleep(serve_s)
            answer = {
                "id": "chatcmpl-limited",
                "object": "chat.completion",
                "model": request.get("model"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "Fine.\nScore: 7"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"total_tokens": server.usage_tokens},
            }
            server.done()
            send_answer(self, 200, "application/json", json.dumps(answer).encode())

    return Handler
