"""A protocol double of vLLM's sleep mode, for the one engine path no real engine here has.

vLLM needs a GPU and `transformers serve` has no sleep endpoints, so the `sleep_endpoints` branch
of `scorers.engine.lifecycle` (`GET /is_sleeping`, `POST /sleep?level=1`, `POST /wake_up`) is
driven by this stdlib server: it answers those, `/health`, `/v1/models` and chat completions (the
reply counts the prompt's words; refused while asleep, as vLLM's would fail), and appends each
sleep and wake to a journal. The real-engine tests use `transformers serve`.

Usage: python tests/helpers/sleepy_engine.py MODEL PORT JOURNAL
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL, PORT, JOURNAL = sys.argv[1], int(sys.argv[2]), sys.argv[3]
STATE = {"sleeping": False}


class Handler(BaseHTTPRequestHandler):
    def _answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/health":
            self._answer(200, {})
        elif self.path == "/v1/models":
            self._answer(200, {"data": [{"id": MODEL}]})
        elif self.path == "/is_sleeping":
            self._answer(200, {"is_sleeping": STATE["sleeping"]})
        else:
            self._answer(404, {})

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        path = self.path.partition("?")[0]
        if path in ("/sleep", "/wake_up"):
            STATE["sleeping"] = path == "/sleep"
            with open(JOURNAL, "a") as journal:
                journal.write(f"{path}\n")
            self._answer(200, {})
        elif path == "/v1/chat/completions" and not STATE["sleeping"]:
            prompt = json.loads(body)["messages"][0]["content"]
            reply = " ".join(["yes"] * (len(prompt.split()) % 5 + 1))
            self._answer(200, {"choices": [{"message": {"content": reply}}]})
        else:
            self._answer(503 if STATE["sleeping"] else 404, {"error": "asleep or unknown"})

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet: the engine log is for failures


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
