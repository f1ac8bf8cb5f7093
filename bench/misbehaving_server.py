"""A scorer server that answers like a broken or hostile one, in front of a real scorer server.

`/health` is relayed as it is; a `/score` answer is relayed in the chosen way: `trickle`
sends the real (valid) answer one byte every `trickle_s`; `gzip_bomb` answers with
`gzip_mib` MiB of zeros compressed to a few hundred KB, marked `content-encoding: gzip`
whatever the client asked for; `bare_health` answers /health without saying what it serves;
`anonymous` relays every answer without the scorer's identity header (a server older than it). Each
request's `accept-encoding` is recorded. Stdlib plus httpx (to reach the real server).
"""

from __future__ import annotations

import zlib
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx

from bench.loopback_server import LoopbackServer, send_answer


def gzip_of_zeros(mib: int) -> bytes:
    """`mib` MiB of zero bytes in the gzip format, compressed a MiB at a time."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(2**20)
    return b"".join(packer.compress(zeros) for _ in range(mib)) + packer.flush()


class MisbehavingServer(LoopbackServer):
    """`with MisbehavingServer(upstream_url, mode) as server:` serves on `server.url` until the
    block ends."""

    def __init__(
        self, upstream: str, mode: str, trickle_s: float = 0.05, gzip_mib: int = 512
    ) -> None:
        self.upstream, self.mode, self.trickle_s = upstream, mode, trickle_s
        self.bomb = gzip_of_zeros(gzip_mib) if mode == "gzip_bomb" else b""
        self.accept_encodings: list[str | None] = []
        super().__init__(_handler(self), "misbehaving")


def _handler(server: MisbehavingServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
            """Quiet."""

        def _relay(self, method: str) -> httpx.Response:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            server.accept_encodings.append(self.headers.get("accept-encoding"))
            headers = {
                k: v
                for k, v in self.headers.items()
                if k.lower() in ("authorization", "content-type")
            }
            headers.update(
                {k: v for k, v in self.headers.items() if k.lower().startswith("x-managed-scorers")}
            )
            return httpx.request(
                method, server.upstream + self.path, content=body, headers=headers, timeout=60
            )

        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            answer = self._relay("GET")
            if server.mode == "bare_health":  # a server that is up, but not a scorer server
                self._send(200, "application/json", b'{"state": "ready"}')
                return
            self._send(answer.status_code, answer.headers.get("content-type", ""), answer.content)

        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            answer = self._relay("POST")
            # identity
            ours = {
                k: v for k, v in answer.headers.items() if k.lower().startswith("x-managed-scorers")
            }
            if server.mode == "anonymous":
                ours = {}
            try:
                if self.path != "/score" or server.mode in ("plain", "anonymous"):
                    self._send(
                        answer.status_code,
                        answer.headers.get("content-type", ""),
                        answer.content,
                        ours,
                    )
                elif server.mode == "gzip_bomb":
                    bomb = {"content-encoding": "gzip", **ours}
                    self._send(200, answer.headers["content-type"], server.bomb, bomb)
                else:
                    self._send(
                        200,
                        answer.headers["content-type"],
                        answer.content,
                        ours,
                        trickle=server.trickle_s,
                    )
            except (BrokenPipeError, ConnectionResetError):  # the client gave up: what it should do
                self.close_connection = True

        def _send(
            self,
            status: int,
            kind: str,
            payload: bytes,
            headers: dict[str, str] | None = None,
            trickle: float = 0,
        ) -> None:
            send_answer(self, status, kind, payload, headers, trickle)

    return Handler
