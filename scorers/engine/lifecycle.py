"""An engine's residency: awake (serving, its weights in memory) or asleep.

Two ways to sleep, chosen once the engine first answers and reported as `engine_offload_mode`:
- `sleep_endpoints`: the engine has vLLM's sleep mode (`GET /is_sleeping` answers, which vLLM does
  with `--enable-sleep-mode` and `VLLM_SERVER_DEV_MODE=1`): `POST /sleep?level=1` drops the weights
  and KV cache from the GPU (weights kept in CPU memory), `POST /wake_up` restores them;
- `restart`: any other engine (`transformers serve`, a vLLM without sleep mode): sleep stops the
  engine process, which frees all its memory, and wake starts it again and waits until it is ready.
"""

from __future__ import annotations

import time
from typing import Any

from scorers.engine.process import EngineFailed, EngineProcess, http_json

SLEEP_ENDPOINTS, RESTART = "sleep_endpoints", "restart"
CALL_S = 120.0  # one sleep or wake request (vLLM moves the weights within it)


class EngineSlot:
    """The engine of one named model and whether it is awake."""

    def __init__(self, engine: EngineProcess) -> None:
        self.engine = engine
        self.mode: str | None = None  # known once started
        self.awake = False
        self.last: dict[str, float] = {}  # seconds of the last start, wake and sleep
        self.failed = False  # a call failed for the engine: the next one starts it anew

    def start(self) -> None:
        """Start the engine (a failure here is the scorer's boot failure) and learn its mode."""
        self.last["start_s"] = self.engine.start()
        self.awake = True
        status, body = http_json("GET", f"http://{self.engine.address}/is_sleeping", 5.0)
        sleeps = status == 200 and isinstance(body, dict) and "is_sleeping" in body
        self.mode = SLEEP_ENDPOINTS if sleeps else RESTART

    def serving(self, doing: str) -> None:
        """Before a call: an engine whose failure a call has already reported is stopped and
        started again (one failed call, then recovery, as a crashed child is restarted); an
        engine found dead now fails this call, naming its status and log."""
        if self.failed:
            self.engine.stop()
            self.last["start_s"] = self.engine.start()
            self.failed = False
        try:
            self.engine.check_alive(doing)
        except EngineFailed:
            self.failed = True
            raise

    def wake(self) -> dict[str, Any]:
        if self.awake:
            self.serving("waking")
            return {"changed": False}
        began = time.monotonic()
        if self.mode == SLEEP_ENDPOINTS:
            self.engine.check_alive("asleep")
            self._post("/wake_up")
        else:
            self.engine.start()
        self.awake = True
        self.last["wake_s"] = time.monotonic() - began
        return {"changed": True, "engine_offload_mode": self.mode}

    def sleep(self) -> dict[str, Any]:
        if not self.awake:
            return {"changed": False}
        began = time.monotonic()
        if self.mode == SLEEP_ENDPOINTS:
            self.engine.check_alive("going to sleep")
            self._post("/sleep?level=1")
        else:
            self.engine.stop()
        self.awake = False
        self.last["sleep_s"] = time.monotonic() - began
        return {"changed": True, "engine_offload_mode": self.mode}

    def _post(self, path: str) -> None:
        status, body = http_json("POST", f"http://{self.engine.address}{path}", CALL_S)
        if status != 200:
            raise EngineFailed(self.engine.describe(f"POST {path} answered {status or body}"))
