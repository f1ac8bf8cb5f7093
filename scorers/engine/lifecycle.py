"""An engine's residency: awake (serving, its weights in memory) or asleep.

Two ways to sleep, chosen once the engine first answers and reported as `engine_offload_mode`:
- `sleep_endpoints`: the engine has vLLM's sleep mode (`GET /is_sleeping` answers, which vLLM does
  with `--enable-sleep-mode` and `VLLM_SERVER_DEV_MODE=1`): `POST /sleep?level=1` drops the weights
  and KV cache from the GPU (weights kept in CPU memory), `POST /wake_up` restores them;
- `restart`: any other engine (`transformers serve`, a vLLM without sleep mode): sleep stops the
  engine process, which frees all its memory, and wake starts it again and waits until it is ready.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
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
        self.restarts = 0  # fresh starts after a failure or a death, reported by the next call

    def start(self) -> None:
        """Start the engine (a failure here is the scorer's boot failure) and learn its mode."""
        self.last["start_s"] = self.engine.start()
        self.awake = True
        status, body = http_json("GET", f"http://{self.engine.address}/is_sleeping", 5.0)
        sleeps = status == 200 and isinstance(body, dict) and "is_sleeping" in body
        self.mode = SLEEP_ENDPOINTS if sleeps else RESTART

    def serving(self, doing: str) -> None:
        """Before a call: an engine whose failure a call has already reported is started anew
        (one failed call, then recovery, as a crashed child is restarted); an engine found dead
        now fails this call, naming its status and log, and is started anew by the next."""
        if self.failed:
            self._fresh()
        self.checked(lambda: self.engine.check_alive(doing))

    def checked(self, check: Callable[[], None]) -> None:
        """Run an engine check; its failure marks the engine for a fresh start by the next call."""
        try:
            check()
        except EngineFailed:
            self.failed = True
            raise

    def _restarted(self, why: EngineFailed) -> None:
        """A fresh start in place of a wake that found the engine gone: no call was served by it
        since its last sleep, so no reward is lost; said in the child's log and counted
        (`engine_restarts`)."""
        print(f"engine_model: restarting the engine after: {why}", file=sys.stderr, flush=True)
        self.restarts += 1
        self._fresh()

    def _fresh(self) -> None:
        """Stop what is left of the engine and start it again: awake, serving."""
        self.engine.stop()
        self.last["start_s"] = self.engine.start()
        self.awake, self.failed = True, False

    def wake(self) -> dict[str, Any]:
        if self.awake and not self.failed:
            self.serving("waking")
            return {"changed": False}
        began = time.monotonic()
        if self.mode == SLEEP_ENDPOINTS and self.engine.running() and not self.failed:
            try:
                self._post("/wake_up")
                self.awake = True
            except EngineFailed as exc:  # it died asleep (its keeper may not have seen it yet)
                if self.engine.check_answering_quietly():
                    raise
                self._restarted(exc)
        else:  # restart mode; or a sleeping engine that died, or failed a call: a fresh start
            if self.failed or self.mode == SLEEP_ENDPOINTS:
                self.restarts += 1
            self._fresh()
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
            self.failed = True
            raise EngineFailed(self.engine.describe(f"POST {path} answered {status or body}"))
