"""ManagedScorerProcessBackend: one scorer child per rank, from an explicit venv python."""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Mapping, TypeVar

from child_runtime.exit_codes import is_boot_failure
from supervisor.backend import check_reward_names, score_in_chunks
from child_runtime.shared_segment import HeapArena, ParentSegment, SharedArena
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
from supervisor.types import RewardRequest, RewardResponse

log = logging.getLogger(__name__)
T = TypeVar("T")

# A dead child closes its sockets at once; this only bounds the wait for its exit status.
DEATH_CONFIRM_S = 2.0
SHUTDOWN_REQUEST_S = 2.0
TERM_GRACE_S = 1.0  # between SIGTERM and SIGKILL, inside close()'s deadline
_DROPPED_ENV = ("PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONPATH")
# glibc returns every freed block over 128 KiB (or at the heap top) to the OS, so each
# in-band body (a few MB, copied 2-3 times by uvicorn and starlette) comes back as fresh
# pages that fault on first touch: 9 ms of a 6.3 MB receive on this VM, 3 ms with these.
# Blocks under 64 MiB stay in the heap; up to 256 MiB of free heap top is kept for reuse.
# Model weights (larger) are still mmapped, and residency changes call malloc_trim.
# Set either variable in process.env to override.
_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


def _kill_group_at_exit(pid: int) -> None:
    """Last resort if the owner is collected or the interpreter exits without close()."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass(eq=False)
class _Generation:
    """One child, the client that talks to it and its data-plane segment; a restart makes a new one."""

    child: ChildProcess
    client: ChildClient
    finalizer: weakref.finalize
    segment: ParentSegment | None = None

    def release(self) -> None:
        """Close the connections and the parent's side of the segment (the child's dies with it)."""
        self.client.close()
        if self.segment is not None:
            self.segment.close()


class ManagedScorerProcessBackend(HttpScoringBackend):
    """Starts its child on construction (unless `start=False`); `close()` always ends it.

    Thread-safe. Scoring, onload and offload are serialised per backend (the child does
    one at a time anyway, so a deadline measures service time, not queueing), and only
    they restart a dead child; health and drain never wait for a score or a restart.
    Errors always concern the generation that produced them: a call that was talking
    to a child that has since been replaced never touches the new one.
    """

    def __init__(self, spec: ManagedScorerProcessSpec | Mapping[str, Any], start: bool = True) -> None:
        self.spec = spec if isinstance(spec, ManagedScorerProcessSpec) else ManagedScorerProcessSpec.model_validate(spec)
        self._gen: _Generation | None = None
        self._dead: ScorerError | None = None
        self._failed_at = 0.0
        self._restarts: list[float] = []
        self._closed = False
        self._closing = threading.Event()
        self._want_offloaded = False  # what a restarted resident child should boot as
        self._life = threading.RLock()
        self._serial = threading.RLock()
        self.timings: dict[str, float] = {}
        self.required_rewards: list[str] = list(self.spec.client.required_rewards)
        self.max_request_bytes = self.spec.limits.max_request_bytes
        if start:
            self.start()

    # -- lifecycle -------------------------------------------------------------------------
    def _offer_segment(self) -> ParentSegment | None:
        if self.spec.client.shared_memory_min_bytes is None:
            return None
        try:
            return ParentSegment(self.spec.limits.max_request_bytes)
        except OSError as exc:
            log.warning("no shared-memory data plane for %s (%s); arrays travel in-band", self.spec.scorer.name, exc)
            return None

    def _plan(self, segment: ParentSegment | None) -> LaunchPlan:
        process, scorer = self.spec.process, self.spec.scorer
        env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
        if not any(key in process.env for key in _MALLOC_ENV):
            env.update(_MALLOC_ENV)
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
            "boot_offloaded": self._want_offloaded,
            "device": scorer.device,
            "graceful_timeout_s": max(0.1, process.shutdown_timeout / 2),
            "limits": self.spec.limits.model_dump(),
            "shared_fd": segment.child_fd if segment else None,
        }
        return LaunchPlan(
            name=scorer.name.lower().replace(".", "_").replace(":", "_"),
            python_executable=process.python_executable, service_root=process.service_root, boot=boot,
            env=env, log_dir=process.log_dir, rank=process.local_rank, startup_timeout=process.startup_timeout,
            pass_fds=(segment.child_fd,) if segment else (),
        )

    def _launch(self) -> tuple[_Generation, dict[str, Any]]:
        """Spawn a child and wait until it serves; nothing is installed until it does."""
        segment = self._offer_segment()
        try:
            child = ChildProcess(self._plan(segment))
            info = child.start()
        except BaseException:
            if segment is not None:
                segment.close()
            raise
        if segment is not None and not info.get("shared_memory"):
            log.warning("child %s refused the shared-memory data plane (%s); arrays travel in-band",
                        self.spec.scorer.name, info.get("shared_memory_error"))
            segment.close()
            segment = None
        finalizer = weakref.finalize(self, _kill_group_at_exit, child.pid)
        client = ChildClient.for_child(child.port, child.token, self.spec.process.request_timeout, segment,
                                       self.spec.client.shared_memory_min_bytes or 0)
        self.timings["spawn_to_ready_s"] = info["spawn_to_ready_s"]
        return _Generation(child, client, finalizer, segment), info

    def start(self) -> dict[str, Any]:
        """Spawn the child and wait until it serves; raises ScorerStartupError otherwise."""
        with self._life:
            if self._gen is not None:
                raise RuntimeError(f"backend already started its child (pid {self.pid})")
            if self._closed:
                raise ScorerProcessDied("backend is closed")
            self._gen, info = self._launch()
        try:
            self.required_rewards = check_reward_names(
                self.spec.scorer.name, info["terms"], self.spec.client.required_rewards, self.spec.client.weights)
        except Exception:
            self.close()
            raise
        return info

    def _restart_delay(self, cause: ScorerError) -> float:
        """Seconds to wait before restarting; raises when the policy forbids a restart."""
        policy = self.spec.restart
        if isinstance(cause, ScorerCrashLoop):
            raise ScorerCrashLoop(cause.args[0].splitlines()[0], cause.record)
        if isinstance(cause, ScorerStartupError) and is_boot_failure(cause.returncode):
            raise ScorerStartupError(f"not restarting: the child cannot boot ({cause.args[0].splitlines()[0]})",
                                     cause.record)
        now = time.monotonic()
        recent = [t for t in self._restarts if now - t < policy.window_s]
        if len(recent) >= policy.max_restarts:
            loop = ScorerCrashLoop(
                f"child is no longer serving: {len(recent)} restarts in the last {policy.window_s:.0f} s "
                f"(max_restarts={policy.max_restarts}); last failure: {cause.args[0].splitlines()[0]}", cause.record)
            with self._life:
                self._dead = loop  # a crash loop stops the backend for good, not for one window
            raise loop
        return max(0.0, self._failed_at + policy.backoff_s - now)

    def _restart(self, old: _Generation, cause: ScorerError) -> _Generation:
        """Replace a dead child. Runs under the serial lock (one restarter); launches outside `_life`."""
        if self._closing.wait(self._restart_delay(cause)):
            raise ScorerProcessDied("backend closed while waiting to restart", cause.record)
        self._restarts.append(time.monotonic())
        if old.child.proc is not None and old.child.proc.returncode is not None:
            old.finalizer.detach()  # reaped; an unreapable child keeps its kill-at-exit
        old.release()
        try:
            new, _ = self._launch()
        except BaseException as exc:
            error = exc if isinstance(exc, ScorerError) else ScorerStartupError(f"restart failed: {exc!r}")
            with self._life:
                self._dead, self._failed_at = error, time.monotonic()
            if error is exc or not isinstance(exc, Exception):  # never turn Ctrl-C into a scorer error
                raise
            raise error from exc
        with self._life:
            if self._closed:  # close() ran while we launched: this child must not outlive it
                new.child.stop(graceful_s=0.0)
                new.finalizer.detach()
                new.release()
                raise ScorerProcessDied("backend closed during a restart", new.child.record())
            self._gen, self._dead = new, None
        self.timings["last_restart_s"] = time.monotonic() - self._restarts[-1]
        log.warning("restarted child %s: pid %s -> %s (%d restarts)", self.spec.scorer.name, old.child.pid,
                    new.child.pid, len(self._restarts))
        return new

    @property
    def restarts(self) -> int:
        return len(self._restarts)

    @property
    def _child(self) -> ChildProcess | None:
        return self._gen.child if self._gen else None

    @property
    def pid(self) -> int | None:
        return self._gen.child.pid if self._gen else None

    @property
    def log_path(self) -> str | None:
        return str(self._gen.child.log_path) if self._gen else None

    @property
    def ready_info(self) -> dict[str, Any]:
        return dict(self._gen.child.ready_info) if self._gen else {}

    def close(self) -> None:
        """/shutdown, then SIGTERM, then SIGKILL of the process group, all within one deadline.

        Returns within `process.shutdown_timeout` plus the SIGKILL reap: a child that is
        frozen or ignores everything is killed at the deadline, not after it.
        """
        self._closing.set()
        with self._life:
            if self._closed:
                return
            self._closed = True
            gen = self._gen
            if gen is None:
                return
            started = time.monotonic()
            budget = self.spec.process.shutdown_timeout
            if gen.child.returncode() is None and self._dead is None:
                try:
                    gen.client.shutdown(min(SHUTDOWN_REQUEST_S, budget))
                except (ChildHTTPError, ChildTransportError, ChildProtocolError) as exc:
                    log.warning("child %s pid %s: /shutdown failed (%s); escalating",
                                self.spec.scorer.name, gen.child.pid, exc)
            left = max(0.0, started + budget - time.monotonic())
            term = min(TERM_GRACE_S, left / 2)
            gen.child.stop(graceful_s=left - term, term_s=term)
            gen.finalizer.detach()
            gen.release()
            self.timings["shutdown_s"] = time.monotonic() - started

    # -- calls -----------------------------------------------------------------------------
    def _record(self) -> ChildRecord | None:
        return self._gen.child.record() if self._gen else None

    def _ensure_serving(self, restart: bool) -> _Generation:
        with self._life:
            if self._closed:
                raise ScorerProcessDied("backend is closed", self._record())
            if self._gen is None:
                raise RuntimeError("backend was created with start=False; call start() first")
            gen, dead = self._gen, self._dead
            if dead is None:
                if gen.child.returncode() is not None:
                    self._fail(gen, ScorerProcessDied("child exited between calls", gen.child.finish()))
                return gen
            if not restart:
                raise type(dead)(f"child is not serving (the next score or onload restarts it): "
                                 f"{dead.args[0].splitlines()[0]}", dead.record)
        return self._restart(gen, dead)

    def _fail(self, gen: _Generation, error: ScorerError) -> None:
        """Mark `gen` dead if it is still the current one (the next call restarts it), and raise."""
        with self._life:
            if gen is self._gen and self._dead is None:
                self._dead, self._failed_at = error, time.monotonic()
            if gen.child.proc is not None and gen.child.proc.returncode is not None:
                gen.finalizer.detach()  # reaped: its pid may be reused, never killpg it at exit
        raise error

    def _condemn(self, gen: _Generation, make_error: Callable[[ChildRecord], ScorerError]) -> None:
        """Kill a child whose state or answers cannot be trusted, reap it, fail with its record."""
        gen.child.signal_group(signal.SIGKILL)
        gen.child.wait_exit(DEATH_CONFIRM_S)
        self._fail(gen, make_error(gen.child.finish()))

    def _call(self, what: str, fn: Callable[[ChildClient], T], restart: bool = False) -> T:
        gen = self._ensure_serving(restart)
        try:
            return fn(gen.client)
        except ChildHTTPError as exc:
            raise ScorerRequestError(
                f"{what}: child answered HTTP {exc.status} ({exc.kind}): {exc.message}",
                gen.child.record(), status=exc.status, kind=exc.kind,
            ) from exc
        except (ChildProtocolError, ChildTransportError, RewardContractError) as exc:
            if self._closed or gen is not self._gen or self._dead is not None:
                raise ScorerProcessDied(f"{what}: the backend was closed, or the child replaced or failed, during "
                                        f"the call ({exc})", gen.child.record()) from exc
            self._fail_call(gen, what, exc)
            raise AssertionError("unreachable") from exc

    def _fail_call(self, gen: _Generation, what: str, exc: Exception) -> None:
        """Map a failed call to its typed error; the child is dead, hung or untrustworthy."""
        first = str(exc).splitlines()[0]
        if isinstance(exc, RewardContractError):
            self._condemn(gen, lambda r: RewardContractError(f"{first}; child killed, its answers cannot be trusted", r))
        if isinstance(exc, ChildProtocolError):
            self._condemn(gen, lambda r: RewardContractError(f"{what}: {first}; child killed", r))
        if exc.timed_out and gen.child.returncode() is None:  # hung, not dead: kill at the deadline
            self._condemn(gen, lambda r: ScorerTimeout(f"{what}: {first}; child killed, its state is unknown", r))
        if gen.child.wait_exit(DEATH_CONFIRM_S):
            self._fail(gen, ScorerProcessDied(f"child died during {what}", gen.child.finish()))
        self._condemn(gen, lambda r: ScorerProcessDied(
            f"{what}: transport failed with the child alive ({first}); child killed", r))

    def compute_rewards(self, request: RewardRequest) -> RewardResponse:
        with self._serial:
            return score_in_chunks(request, self.spec.client.request_batch_size, self._score_chunk,
                                   self.required_rewards, self.spec.client.weights)

    def onload(self) -> dict[str, Any]:
        """Restarts a dead child (booting it resident), then onloads; waits for a running score."""
        with self._serial:
            self._want_offloaded = False  # a restart for this onload boots resident
            return self._call("onload", lambda client: client.onload(), restart=True)

    def offload(self) -> dict[str, Any]:
        """Waits for a running score, then offloads; a restarted child will boot offloaded."""
        with self._serial:
            figures = self._call("offload", lambda client: client.offload())
            self._want_offloaded = True  # only once the child really is offloaded
            return figures

    def arena(self) -> SharedArena | HeapArena:
        """Arrays in the current child's shared segment (scored in place); ordinary memory when
        the child has no segment. After a restart, older arena arrays are copied like any other."""
        gen = self._gen
        if gen is not None and gen.segment is not None and gen.segment.fd >= 0:
            return SharedArena(gen.segment)
        return HeapArena()

    def health(self) -> dict[str, Any]:
        return self._call("health", lambda client: client.health())

    def drain(self, timeout_s: float | None = None) -> dict[str, Any]:
        bound = timeout_s if timeout_s is not None else self.spec.process.request_timeout
        return self._call("drain", lambda client: client.drain(bound))
