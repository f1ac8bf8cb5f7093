"""A fake OpenAI chat endpoint with limits of its own, on loopback: what a shared judge API does.

It counts requests in flight and arrivals, and answers 429 (with a Retry-After) to a request past
its `concurrency` or past `per_second` arrivals in the trailing second. A request it serves waits
`base_s + per_load_s * in_flight` (so latency rises with load), then answers "Score: 7" with a
`usage` of `usage_tokens`. A request counts as in flight from its arrival until its answer is about
to be written, so a client that releases its slot once it has the answer can never make the count
pass the number of slots. `capacity` may be changed while it serves. Stdlib only.
"""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from bench.hard_limit import HardLimit
from bench.loopback_server import LoopbackServer, send_answer

# The judge's params the tests and drivers use against it: quick retries, one minute per batch.
JUDGE = {
    "model": "fake-judge",
    "prompt_template": "Rate this: {completion}",
    "max_tokens": 16,
    "concurrency": 8,
    "request_timeout_s": 30,
    "max_attempts": 3,
    "backoff_s": 0.1,
    "backoff_max_s": 0.5,
    "batch_timeout_s": 60,
}


class LimitedOpenAI(HardLimit, LoopbackServer):
    def __init__(
        self,
        concurrency: int | None = None,
        per_second: int | None = None,
        base_s: float = 0.05,
        per_load_s: float = 0.0,
        usage_tokens: int = 40,
    ) -> None:
        HardLimit.__init__(self, concurrency, per_second, base_s, per_load_s)
        self.usage_tokens = usage_tokens
        LoopbackServer.__init__(self, _handler(self), "limited-openai", poll_s=0.1)
        self.base_url = f"{self.url}/v1"


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
