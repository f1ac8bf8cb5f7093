"""The coordinator served by uvicorn: in a thread of this process (a Ray actor's) or as the
process itself (`managed-scorers limits-coordinator`). The socket is bound before the server
starts, so the address is known and a port in use is reported at once."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

from supervisor.errors import ConfigError

START_TIMEOUT_S = 30.0


def needs_serving(command: str) -> None:
    """The coordinator is served by starlette and uvicorn (the `serving` extra): one line naming
    the install where they are missing, before anything is bound."""
    from scorers import install

    missing = install.missing_extra("serving", command, ("starlette", "uvicorn"))
    if missing is not None:
        raise ConfigError(missing)


def listening(host: str, port: int) -> socket.socket:
    """A socket listening on `host:port` (0: any free port); ConfigError naming it if it cannot."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as exc:
        listener.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    listener.listen(1024)
    return listener


def _server(token: str) -> object:
    import uvicorn

    from supervisor.limits.app import app

    # callers keep their connections between calls (a renewal every 2 s at least)
    config = uvicorn.Config(
        app(token), log_level="warning", lifespan="off", access_log=False, timeout_keep_alive=60
    )
    return uvicorn.Server(config)


@dataclass
class Hosted:
    url: str
    server: object
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True  # type: ignore[attr-defined]
        self.thread.join(timeout=START_TIMEOUT_S)


def in_thread(host: str, port: int, token: str) -> Hosted:
    """The coordinator on `host:port` (0: any free port) in a daemon thread, started."""
    listener = listening(host, port)
    server = _server(token)
    thread = threading.Thread(
        target=server.run,  # type: ignore[attr-defined]
        kwargs={"sockets": [listener]},
        name="limits-coordinator",
        daemon=True,
    )
    thread.start()
    shown = f"[{host}]" if ":" in host else host
    hosted = Hosted(f"http://{shown}:{listener.getsockname()[1]}", server, thread)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started and thread.is_alive() and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.01)
    if not server.started:  # type: ignore[attr-defined]
        hosted.stop()
        raise RuntimeError(f"the limits coordinator did not start on {hosted.url} in time")
    return hosted


def run_here(listener: socket.socket, token: str) -> None:
    """Serve on `listener` in this thread until SIGTERM or Ctrl-C."""
    server = _server(token)
    server.run(sockets=[listener])  # type: ignore[attr-defined]
