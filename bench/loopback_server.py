"""A stdlib HTTP server on 127.0.0.1 in a daemon thread, for `with` blocks: the fakes the tests and
benches talk to (a fake OpenAI judge, a misbehaving scorer server) are one each of these."""

from __future__ import annotations

import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hangs up (what a bounded client does at its deadline or cap) is not an
        error."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class LoopbackServer:
    """Serves `handler` at `self.url` (http://127.0.0.1:PORT) from entering the block until it
    ends."""

    def __init__(
        self,
        handler: type[BaseHTTPRequestHandler],
        name: str,
        poll_s: float = 0.5,
        backlog: int = 5,
    ) -> None:
        """`poll_s`: how often the serving thread looks for a shutdown (what leaving the block
        waits); `backlog`: connections the kernel queues before one is accepted (hundreds of
        clients connecting at once need more than the default 5, or a SYN is retried 1 s later)."""
        self._server = _QuietServer(("127.0.0.1", 0), handler, bind_and_activate=False)
        self._server.request_queue_size = backlog
        try:
            self._server.server_bind()
            self._server.server_activate()
        except BaseException:
            self._server.server_close()
            raise
        self._server.daemon_threads = True
        self._server.block_on_close = False
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(poll_s,), name=name, daemon=True
        )

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


def send_answer(
    handler: BaseHTTPRequestHandler,
    status: int,
    kind: str,
    payload: bytes,
    headers: dict[str, str] | None = None,
    trickle_s: float = 0.0,
) -> None:
    """One answer with its content-length; with `trickle_s`, its body a byte at a time, that far
    apart."""
    handler.send_response(status)
    handler.send_header("content-type", kind)
    handler.send_header("content-length", str(len(payload)))
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.end_headers()
    if not trickle_s:
        handler.wfile.write(payload)
        return
    for byte in payload:
        handler.wfile.write(bytes([byte]))
        handler.wfile.flush()
        time.sleep(trickle_s)
