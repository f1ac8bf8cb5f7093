"""ManagedScorerProcessBackend: one scorer child per rank, from an explicit venv python."""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
import weakref
from typing import Any, Callable, Mapping, Sequence, TypeVar

import numpy as np

from child_runtime.exit_codes import is_boot_failure
from supervisor.backend import check_reward_names, score_in_chunks
from supervisor.client import ChildClient, ChildHTTPError, ChildProtocolError, ChildTransportError
from supervisor.config import ManagedScorerProcessSpec
from supervisor.errors import (
    ChildRecord,
    RewardContractError,
    ScorerError,
    ScorerProcessDied,
    ScorerCrashLoop,
    ScorerRequestError,
    ScorerStartupError,
    ScorerTimeout,
)
from supervisor.gpu import child_visible_devices
from supervisor.http_backend import HttpScoringBackend
from supervisor.process import ChildProcess, LaunchPlan
from supervisor.types import RewardItem, RewardRequest, RewardResponse

log = logging.getLogger(__name__)
T = TypeVar("T")

# A dead child closes its sockets at once; this only bounds the wait for its exit status.
DEATH_CONFIRM_S = 2.0
SHUTDOWN_REQUEST_S = 2.0
_DROPPED_ENV = ("PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONPATH")


def _kill_group_at_exit(pid: int) -> None:
    """Last resort if the owner is collected or the interpreter exits without close()."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class ManagedScorerProcessBackend(HttpScoringBackend):
    """Starts its child on construction (unless `start=False`); `close()` always ends it.

    Thread-safe: scoring calls are serialised per backend (the child scores one
    batch at a time, so the request deadline measures service time, not queueing);
    health and lifecycle calls are not held up by a running score.
    """

    def __init__(self, spec: ManagedScorerProcessSpec | Mapping[str, Any], start: bool = True) -> None:
        self.spec = spec if isinstance(spec, ManagedScorerProcessSpec) else ManagedScorerProcessSpec.model_validate(spec)
        self._child: ChildProcess | None = None
        self._client: ChildClient | None = None
        self._finalizer: weakref.finalize | None = None
        self._dead: ScorerError | None = None
        self._failed_at = 0.0
        self._restarts: list[float] = []
        self._closed = False
        self._life = threading.RLock()
        self._scoring = threading.Lock()
        self.timings: dict[str, float] = {}
        self.required_rewards: list[str] = list(self.spec.client.required_rewards)
        self.max_request_bytes = self.spec.limits.max_request_bytes
        if start:
            self.start()

    # -- lifecycle -------------------------------------------------------------------------
    def _plan(self) -> LaunchPlan:
        process, scorer = self.spec.process, self.spec.scorer
        env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
        env.update(process.env)
        extra_path = process.env.get("PYTHONPATH")
        env["PYTHONPATH"] = str(process.service_root) + (os.pathsep + extra_path if extra_path else "")
        env["PYTHONUNBUFFERED"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = child_visible_devices(
            os.environ, process.local_rank, process.visible_devices, process.allow_multiple_gpus
        )
        boot = {
            "scorer": {"name": scorer.name, "params": scorer.params, "revision": scorer.revision,
                       "input_kind": scorer.input_kind},
            "gpu_residency": self.spec.gpu_residency,
            "device": scorer.device,
            "graceful_timeout_s": max(0.1, process.shutdown_timeout / 2),
            "limits": self.spec.limits.model_dump(),
        }
        return LaunchPlan(
            name=scorer.name.lower().replace(".", "_").replace(":", "_"),
            python_executable=process.python_executable, service_root=process.service_root, boot=boot,
            env=env, log_dir=process.log_dir, rank=process.local_rank, startup_timeout=process.startup_timeout,
        )

    def start(self) -> dict[str, Any]:
        """Spawn the child and wait until it serves; raises ScorerStartupError otherwise."""
        with self._life:
            if self._child is not None:
                raise RuntimeError(f"backend already started its child (pid {self.pid})")
            info = self._launch()
            try:
                self.required_rewards = check_reward_names(
                    self.spec.scorer.name, info["terms"], self.spec.client.required_rewards, self.spec.client.weights)
            except Exception:
                self.close()
                raise
            return info

    def _launch(self) -> dict[str, Any]:
        """One child generation: spawn, readiness, client. Caller holds the lifecycle lock."""
        self._child = ChildProcess(self._plan())
        info = self._child.start()
        self._finalizer = weakref.finalize(self, _kill_group_at_exit, self._child.pid)
        self.timings["spawn_to_ready_s"] = info["spawn_to_ready_s"]
        self._client = ChildClient(
            f"http://127.0.0.1:{self._child.port}", self._child.token, self.spec.process.request_timeout
        )
        return info

    def _restart(self) -> None:
        """Replace a dead child, as the restart policy allows; the call that saw it die already raised."""
        cause, policy = self._dead, self.spec.restart
        if isinstance(cause, ScorerStartupError) and is_boot_failure(cause.returncode):
            raise ScorerStartupError(f"not restarting: the child cannot boot ({cause.args[0].splitlines()[0]})",
                                     cause.record)
        now = time.monotonic()
        recent = [t for t in self._restarts if now - t < policy.window_s]
        if len(recent) >= policy.max_restarts:
            raise ScorerCrashLoop(
                f"child is no longer serving: {len(recent)} restarts in the last {policy.window_s:.0f} s "
                f"(max_restarts={policy.max_restarts}); last failure: {cause.args[0].splitlines()[0]}", cause.record)
        time.sleep(max(0.0, self._failed_at + policy.backoff_s - now))  # bounded by backoff_s
        self._restarts.append(time.monotonic())
        self._finalizer.detach()
        self._client.close()
        old_pid, self._dead = self.pid, None
        try:
            self._launch()
        except ScorerStartupError as exc:
            self._dead, self._failed_at = exc, time.monotonic()
            raise
        self.timings["last_restart_s"] = time.monotonic() - self._restarts[-1]
        log.warning("restarted child %s: pid %s -> %s (%d restarts in window)", self.spec.scorer.name, old_pid,
                    self.pid, len(recent) + 1)

    @property
    def restarts(self) -> int:
        return len(self._restarts)

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child else None

    @property
    def log_path(self) -> str | None:
        return str(self._child.log_path) if self._child else None

    @property
    def ready_info(self) -> dict[str, Any]:
        return dict(self._child.ready_info) if self._child else {}

    def close(self) -> None:
        """/shutdown, then SIGTERM, then SIGKILL of the process group; each step bounded."""
        with self._life:
            if self._closed:
                return
            self._closed = True
            if self._child is None:
                return
            started = time.monotonic()
            if self._child.returncode() is None and self._client is not None and self._dead is None:
                try:
                    self._client.shutdown(min(SHUTDOWN_REQUEST_S, self.spec.process.shutdown_timeout))
                except (ChildHTTPError, ChildTransportError, ChildProtocolError) as exc:
                    log.warning("child %s pid %s: /shutdown failed (%s); escalating",
                                self.spec.scorer.name, self.pid, exc)
            self._child.stop(graceful_s=self.spec.process.shutdown_timeout)
            if self._finalizer is not None:
                self._finalizer.detach()
            if self._client is not None:
                self._client.close()
            self.timings["shutdown_s"] = time.monotonic() - started

    # -- calls -----------------------------------------------------------------------------
    def _record(self) -> ChildRecord | None:
        return self._child.record() if self._child else None

    def _ensure_serving(self) -> ChildClient:
        if self._closed:
            raise ScorerProcessDied("backend is closed", self._record())
        if self._child is None or self._client is None:
            raise RuntimeError("backend was created with start=False; call start() first")
        with self._life:
            if self._dead is not None:
                self._restart()
            if self._child.returncode() is not None:
                self._fail(ScorerProcessDied("child exited between calls", self._child.finish()))
            return self._client

    def _fail(self, error: ScorerError) -> None:
        """Remember the child as dead (the next call restarts it, per policy) and raise."""
        with self._life:
            if self._dead is None:
                self._dead, self._failed_at = error, time.monotonic()
        raise error

    def _call(self, what: str, fn: Callable[[ChildClient], T]) -> T:
        client = self._ensure_serving()
        try:
            return fn(client)
        except ChildHTTPError as exc:
            raise ScorerRequestError(
                f"{what}: child answered HTTP {exc.status} ({exc.kind}): {exc.message}",
                self._record(), status=exc.status, kind=exc.kind,
            ) from exc
        except ChildProtocolError as exc:
            raise RewardContractError(f"{what}: {exc}", self._record()) from exc
        except ChildTransportError as exc:
            if self._closed:
                raise ScorerProcessDied(f"{what}: backend closed during the call", self._record()) from exc
            if exc.timed_out and self._child.returncode() is None:  # hung, not dead: kill at the deadline
                self._child.signal_group(signal.SIGKILL)
                self._child.wait_exit(DEATH_CONFIRM_S)
                self._fail(ScorerTimeout(f"{what}: {exc}; child killed, its state is unknown", self._child.finish()))
            if self._child.wait_exit(DEATH_CONFIRM_S):
                self._fail(ScorerProcessDied(f"child died during {what}", self._child.finish()))
            self._child.signal_group(signal.SIGKILL)
            self._child.wait_exit(DEATH_CONFIRM_S)
            self._fail(ScorerProcessDied(f"{what}: transport failed with the child alive ({exc}); child killed",
                                         self._child.finish()))
            raise AssertionError("unreachable") from exc

    def _score_chunk(self, chunk: Sequence[RewardItem]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """A child whose answer breaks the contract cannot be trusted with the next one: kill it."""
        try:
            return super()._score_chunk(chunk)
        except RewardContractError as exc:
            self._child.signal_group(signal.SIGKILL)
            self._child.wait_exit(DEATH_CONFIRM_S)
            self._fail(RewardContractError(f"{exc.args[0].splitlines()[0]}; child killed, its answers cannot be "
                                           "trusted", self._child.finish()))
            raise AssertionError("unreachable") from exc

    def compute_rewards(self, request: RewardRequest) -> RewardResponse:
        with self._scoring:
            return score_in_chunks(request, self.spec.client.request_batch_size, self._score_chunk,
                                   self.required_rewards, self.spec.client.weights)

    def drain(self, timeout_s: float | None = None) -> dict[str, Any]:
        bound = timeout_s if timeout_s is not None else self.spec.process.request_timeout
        return self._call("drain", lambda client: client.drain(bound))
