"""A fake asynchronous job service on loopback (enqueue, then pull until done), for the job
backend's failure matrix. Real HTTP on a real socket (`bench.loopback_server`); stdlib only.

By default it behaves: the bearer token is checked on every call (401 otherwise), an enqueue's
multipart form is parsed and recorded (the .npy loaded with allow_pickle=False), and a pull answers
200 {"scores": [the array's mean]}. A test changes one step: `on_enqueue(upload)` may return an
answer (status, body) or (status, body, headers), or "drop" (close the connection once the whole
request is read); `on_pull(job_id, n)` (n: that job's pulls so far, from 1) may return an answer,
"drop", or ("hang", seconds). None keeps the default. `job_id`, when set, is the id of every upload
(a broken service): a pull of it scores the last upload that got it.
"""

from __future__ import annotations

import io
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

import numpy as np

from bench.loopback_server import LoopbackServer, send_answer

Reply = Any  # (status, body) | (status, body, headers) | "drop" | ("hang", seconds) | None


@dataclass(frozen=True)
class Upload:
    job_id: str
    fields: dict[str, bytes]
    array: np.ndarray
    authorization: str | None
    at: float = 0.0  # when it arrived (time.monotonic())


@dataclass(frozen=True)
class Pull:
    job_id: str
    at: float
    authorization: str | None


def multipart(content_type: str, body: bytes) -> dict[str, bytes]:
    """A multipart/form-data body's fields by name (a test's parser: one level, no encodings)."""
    boundary = content_type.split("boundary=", 1)[1].strip('"').encode()
    fields = {}
    for part in body.split(b"--" + boundary)[1:-1]:
        head, _, value = part.partition(b"\r\n\r\n")
        found = re.search(rb'name="([^"]*)"', head)
        assert found is not None, head
        fields[found.group(1).decode()] = value[:-2]  # the CRLF before the next boundary
    return fields


class FakeJobService(LoopbackServer):
    """`with FakeJobService(token) as service:` serves at `service.url` until the block ends."""

    def __init__(self, token: str | None = "job-token") -> None:
        self.token = token
        self.uploads: list[Upload] = []
        self.enqueues = 0  # every enqueue that arrived, answered or not
        self.pulls: list[Pull] = []
        self.on_enqueue: Callable[[Upload], Reply] = lambda upload: None
        self.on_pull: Callable[[str, int], Reply] = lambda job_id, n: None
        self.job_id: str | None = None  # every upload's id, when set
        self.in_flight = self.max_in_flight = 0
        self.closing = threading.Event()  # a hanging answer ends when the service does
        self._lock = threading.Lock()
        super().__init__(_handler(self), "fake-jobs", poll_s=0.02)

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        super().__exit__(*exc)

    def upload_of(self, job_id: str) -> Upload:
        """The last upload that got `job_id` (the only one, unless `job_id` is fixed)."""
        with self._lock:
            return next(upload for upload in reversed(self.uploads) if upload.job_id == job_id)

    def pulls_of(self, job_id: str) -> list[Pull]:
        return [pull for pull in self.pulls if pull.job_id == job_id]


def _handler(service: FakeJobService) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
            """Quiet: the tests read what the service recorded."""

        def _authorized(self) -> bool:
            if (
                service.token is None
                or self.headers.get("authorization") == f"Bearer {service.token}"
            ):
                return True
            self._reply((401, {"detail": "bad or missing token"}))
            return False

        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            with service._lock:
                service.enqueues += 1
                service.in_flight += 1
                service.max_in_flight = max(service.max_in_flight, service.in_flight)
            reply: Reply = None
            try:
                if self.path == "/enqueue" and self._authorized():
                    fields = multipart(self.headers["content-type"], body)
                    array = np.load(io.BytesIO(fields["file"]), allow_pickle=False)
                    job_id = service.job_id or uuid.uuid4().hex
                    upload = Upload(
                        job_id, fields, array, self.headers.get("authorization"), time.monotonic()
                    )
                    with service._lock:
                        service.uploads.append(upload)
                    reply = service.on_enqueue(upload) or (200, {"uuid": upload.job_id})
            finally:
                # out of flight before the answer goes: the client may send its next at once
                with service._lock:
                    service.in_flight -= 1
            if reply is not None:
                self._reply(reply)

        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            job_id = self.path.rpartition("/")[2]
            with service._lock:
                service.pulls.append(
                    Pull(job_id, time.monotonic(), self.headers.get("authorization"))
                )
                count = len(service.pulls_of(job_id))
            if not self._authorized():
                return
            default = (200, {"scores": [float(service.upload_of(job_id).array.mean())]})
            self._reply(service.on_pull(job_id, count) or default)

        def _reply(self, reply: Reply) -> None:
            if reply == "drop":
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            if reply[0] == "hang":
                service.closing.wait(reply[1])
                reply = (200, {"scores": [0.0]})
            status, body, *headers = reply
            payload = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            send_answer(self, status, "application/json", payload, headers[0] if headers else None)

    return Handler
