"""One engine process (an OpenAI-compatible server: vLLM, `transformers serve`) owned by a scorer.

Started through the keeper (`scorers.engine.keeper`) from the scorer's own env, on a loopback port
chosen here; ready once `GET /health` answers 200 and `GET /v1/models` lists the model; stopped by
closing the keeper's pipe (the keeper ends the engine's group) and reaped within a deadline. Every
failure is an `EngineFailed` naming the model, the keeper's pid, the exit status and the tail of the
engine's log.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scorers.base import ServerFault
from scorers.common.processes import describe
from scorers.engine.procfs import listener_in_session

KEEPER = Path(__file__).with_name("keeper.py")
LOG_TAIL_BYTES = 2000
POLL_S = 0.25
STOP_GRACE_S = 10.0  # SIGTERM to SIGKILL: vLLM frees its GPU memory on a clean exit


class EngineFailed(ServerFault):
    """The engine could not start, answer, sleep or wake, or died: a fault of this server, not of
    the request (503 `server_fault`); the message names the model, the pid, the status, the log."""


def free_port() -> int:
    """A loopback port free now (the engine binds it a moment later; a lost race is a start
    failure that names the port in the log's tail)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def http_json(method: str, url: str, timeout_s: float) -> tuple[int, Any]:
    """(status, parsed JSON or None) of one small request to the engine; a refused or reset
    connection is (0, reason)."""
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            body = answer.read()
            status = answer.status
    except urllib.error.HTTPError as exc:
        return exc.code, None
    # refused, reset, timed out, or a malformed answer: no answer from an engine
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        return 0, f"{type(exc).__name__}: {exc}"
    try:
        return status, json.loads(body) if body else None
    except ValueError:
        return status, None


class EngineProcess:
    """The engine of one named model; not thread-safe (the scorer's host serialises lifecycle)."""

    def __init__(
        self,
        model_name: str,
        command: Sequence[str],
        env: Mapping[str, str] | None = None,
        ready_timeout_s: float = 600.0,
        fields: Mapping[str, str] | None = None,
    ) -> None:
        """`command` is a template: `{port}`, `{python}` and `{bin}` (the env's Python and its
        directory) are filled in at each start, and `fields` (the device) as given."""
        self.model_name, self.template = model_name, list(command)
        self.fields = dict(fields or {})
        self.env = dict(env or {})
        self.ready_timeout_s, self.stop_grace_s = ready_timeout_s, STOP_GRACE_S
        self.port: int | None = None
        self._keeper: subprocess.Popen[bytes] | None = None
        self._alive_w: int | None = None
        self._log_dir = tempfile.mkdtemp(prefix="engine-")
        self.log_path = Path(self._log_dir) / "engine.log"

    @property
    def address(self) -> str:
        """verl's `reward_router_address`: host:port, no scheme."""
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._keeper.pid if self._keeper is not None else None

    def running(self) -> bool:
        return self._keeper is not None and self._status() is None

    def _status(self) -> int | None:
        """The keeper's exit status once it exited (negative: its signal), None while it runs;
        never reaped here, so its pid, and with it the engine's group id, stays reserved until
        `stop()` has killed what is left of the group."""
        if self._keeper is None:
            return None
        if self._keeper.returncode is not None:
            return self._keeper.returncode
        info = os.waitid(os.P_PID, self._keeper.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if info is None or info.si_pid == 0:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def start(self) -> float:
        """Spawn and wait until ready; the seconds it took. A failure stops what was started."""
        began = time.monotonic()
        self.port = free_port()
        values = {**self.fields, "port": str(self.port), "python": sys.executable}
        values["bin"] = str(Path(sys.executable).parent)
        command = [_filled(part, values) for part in self.template]
        if shutil.which(command[0]) is None:
            raise EngineFailed(
                f"engine for model {self.model_name!r}: {command[0]!r} is not an executable here "
                f"(the model's env has no such engine: build it into that env, or give `command:`)"
            )
        alive_r, self._alive_w = os.pipe()
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(command)}\n".encode())
            log.flush()
            self._keeper = subprocess.Popen(
                [sys.executable, str(KEEPER), str(alive_r), str(self.stop_grace_s), *command],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(alive_r,),
                start_new_session=True,  # out of the scorer child's group: see keeper.py
                env={**os.environ, **self.env},
            )
        os.close(alive_r)
        try:
            self._wait_ready(began + self.ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        return time.monotonic() - began

    def _wait_ready(self, deadline: float) -> None:
        base = f"http://{self.address}"
        last = "no answer yet"
        while time.monotonic() < deadline:
            self.check_alive("starting")
            status, body = http_json("GET", f"{base}/health", 2.0)
            if status == 200:
                status, body = http_json("GET", f"{base}/v1/models", 5.0)
                served = _model_ids(body)
                if status == 200 and self.model_name in served:
                    if listener_in_session(self.port or 0, self.pid or 0):
                        return
                    last = f"port {self.port} answers, but not from the engine started here"
                else:
                    last = f"/v1/models answered {status}, serving {served}"
            else:
                last = f"/health answered {status or body}"
            time.sleep(POLL_S)
        raise EngineFailed(
            self.describe(f"not ready within ready_timeout_s={self.ready_timeout_s} ({last})")
        )

    def check_alive(self, doing: str) -> None:
        """Raise EngineFailed (with the log's tail) if the engine has exited."""
        if self._keeper is None:
            raise EngineFailed(f"engine for {self.model_name!r} is not running ({doing})")
        if self._status() is not None:
            raise EngineFailed(self.describe(f"exited while {doing}"))

    def check_answering(self, doing: str) -> None:
        """Raise EngineFailed unless the engine is alive and answers `GET /health` (the keeper of a
        killed engine may take a moment to see it: waited for, so the status is in the message)."""
        self.check_alive(doing)
        status, body = http_json("GET", f"http://{self.address}/health", 5.0)
        if status != 200:
            deadline = time.monotonic() + 1.0  # its status in the message, when it is dying
            while self.running() and time.monotonic() < deadline:
                time.sleep(0.05)
            raise EngineFailed(
                self.describe(f"not answering /health ({status or body}) while {doing}")
            )

    def check_answering_quietly(self) -> bool:
        """True when the engine is alive and answers `GET /health` (no error either way)."""
        return self.running() and http_json("GET", f"http://{self.address}/health", 5.0)[0] == 200

    def describe(self, what: str) -> str:
        """The engine log's tail, then one line naming the model, pid, port, status and log (last,
        where a shortened message keeps it)."""
        status = self._status()
        meaning = describe(status) if status is None or status < 128 else describe(128 - status)
        return (
            f"engine log, last lines:\n{self.log_tail()}\n"
            f"engine for model {self.model_name!r} (keeper pid {self.pid}, port {self.port}): "
            f"{what}; {meaning}; log {self.log_path}"
        )

    def log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
                return log.read().decode(errors="replace")
        except OSError as exc:
            return f"(log unreadable: {exc})"

    def stop(self) -> None:
        """Close the keeper's pipe (it ends the engine's group) and wait for it to exit, SIGKILL
        its group if it outlives the grace; then SIGKILL whatever is left of the group (a keeper
        killed -9 leaves the engine's workers), before reaping the keeper, whose pid keeps the
        group id reserved until then. Idempotent."""
        if self._alive_w is not None:
            os.close(self._alive_w)
            self._alive_w = None
        if self._keeper is None:
            return
        deadline = time.monotonic() + self.stop_grace_s + 5.0
        while self._status() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            os.killpg(self._keeper.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # the group is gone already
        keeper, self._keeper = self._keeper, None
        try:
            keeper.wait(timeout=5.0)
        except subprocess.TimeoutExpired as exc:  # SIGKILLed and still not gone: a stuck kernel
            raise EngineFailed(
                f"engine keeper pid {keeper.pid} for model {self.model_name!r} did not exit "
                f"5 s after SIGKILL"
            ) from exc

    def close(self) -> None:
        """Stop, and remove the log directory."""
        self.stop()
        try:
            self.log_path.unlink(missing_ok=True)
            os.rmdir(self._log_dir)
        except OSError:
            pass  # a log someone else holds open: the directory stays, named in earlier errors


def _filled(part: str, values: Mapping[str, str]) -> str:
    """Only the known placeholders: a literal brace (a JSON argument) stays as written."""
    for key, value in values.items():
        part = part.replace("{" + key + "}", value)
    return part


def _model_ids(body: Any) -> list[str]:
    data = body.get("data") if isinstance(body, dict) else None
    return [str(entry.get("id")) for entry in data or [] if isinstance(entry, dict)]
