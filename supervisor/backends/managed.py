"""ManagedScorerProcessBackend: one scorer child per rank, from an explicit venv python.

A call reads top to bottom: compute_rewards -> score_in_chunks -> _ChildChunks.score_chunk ->
_serving (a dead child is restarted first) -> _exchange(client.score) -> verify.
A failed exchange is handled in one place, `_failure`: it decides what the failure
means for the child (kill it; mark it dead so that the next call restarts it) and
returns the typed error. A child that answers it is wedged (`wire.RESTART_KINDS`: a call
left work running past its deadline on a thread its scorer cannot stop) is killed and
restarted as after a crash. `ChildProcess` alone signals, kills and reaps the child.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from child_runtime.protocol.exit_codes import is_boot_failure
from child_runtime.protocol.wire import CLOSE_FAILED, RESTART_KINDS
from supervisor.arena import Arena, HeapArena
from supervisor.backends import prometheus
from supervisor.child import ranks
from supervisor.child.client import ScorerClient
from supervisor.child.gpu import child_visible_devices
from supervisor.child.import_root import import_root
from supervisor.child.process import ChildProcess, LaunchPlan
from supervisor.child.segment import ParentSegment, SharedArena
from supervisor.child.userdirs import state_dir
from supervisor.chunks import CallPlan, ChunkAnswer, score_in_chunks
from supervisor.composition import Component
from supervisor.config import RESERVED_ENV, ManagedScorerProcessSpec, ProcessConfig
from supervisor.errors import (
    BackendNotOwned,
    BadAnswer,
    ChildRecord,
    ConfigError,
    ConnectFailed,
    ConnectionLost,
    ErrorStatus,
    NoAnswer,
    RewardContractError,
    ScorerCrashLoop,
    ScorerError,
    ScorerIdentityChanged,
    ScorerProcessDied,
    ScorerRequestError,
    ScorerStartupError,
    ScorerTermsFailed,
    ScorerTimeout,
    TransportError,
    scorer_error,
)
from supervisor.outcome import Outcome
from supervisor.shape import ScorerShape, check_reward_names
from supervisor.types import RewardItem, RewardRequest
from supervisor.verify import encode_chunk, verify_score_answer

log = logging.getLogger(__name__)
T = TypeVar("T")

# A dead child closes its sockets at once; this only bounds the wait for its exit status.
DEATH_CONFIRM_S = 2.0
SHUTDOWN_REQUEST_S = 2.0
TERM_GRACE_S = 1.0  # between SIGTERM and SIGKILL, inside close()'s deadline
WARM_ASK_S = 0.05  # warming() asks a warming child's /health at most this often (a server polls it)
# glibc returns every freed block over 128 KiB (or at the heap top) to the OS, so each
# in-band body (a few MB, copied 2-3 times by uvicorn and starlette) comes back as fresh
# pages that fault on first touch: 9 ms of a 6.3 MB receive on this VM, 3 ms with these.
# Blocks under 64 MiB stay in the heap; up to 256 MiB of free heap top is kept for reuse.
# Model weights (larger) are still mmapped, and residency changes call malloc_trim.
# Set either variable in process.env to override.
_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


@dataclass(eq=False)
class _Generation:
    """One child, the client that talks to it and its data-plane segment; a restart makes a new
    one."""

    child: ChildProcess
    client: ScorerClient
    segment: ParentSegment | None = None
    abandoned: bool = False  # a call on it was interrupted (Ctrl-C): the child was killed at once
    retired: bool = False  # its transport bytes moved into the backend's retired counts
    # the child said ready while still warming (a math grader's workers): until it answers a request
    # (a score or an error), one may take until this (its start-up deadline), as the start it waits
    # for was the boot's
    warm_until: float | None = None
    warm_asked: float = 0.0  # when warming() last asked the child's /health
    # what that /health said (False: it did not answer), until the next ask
    warming_said: bool = True

    def score_timeout(self, request_timeout: float) -> float:
        if self.warm_until is None:
            return request_timeout
        return max(request_timeout, self.warm_until - time.monotonic())

    def transport_bytes(self) -> Counter[str]:
        """Request bytes by path: in-band, copied into the shared segment, sent in place from an
        arena."""
        counts = Counter({"in_band": self.client.in_band_bytes})
        if self.segment is not None:
            counts.update(
                {
                    "shared_copied": self.segment.copied_bytes,
                    "shared_in_place": self.segment.in_place_bytes,
                }
            )
        return counts

    def release(self) -> None:
        """Close the connections and the parent's side of the segment (the child's dies with it)."""
        self.client.close()
        if self.segment is not None:
            self.segment.close()


def _once(make: Callable[[], T]) -> Callable[[], T]:
    """`make()` on the first call, from whichever thread; its result (or its error) on every
    call."""
    lock = threading.Lock()
    made: list[T] = []
    failed: list[BaseException] = []

    def get() -> T:
        with lock:
            if failed:
                raise failed[0]
            if not made:
                try:
                    made.append(make())
                except BaseException as exc:
                    failed.append(exc)
                    raise
            return made[0]

    return get


def _working_directory() -> Path:
    try:
        return Path.cwd()
    except FileNotFoundError:  # the trainer's directory was removed under it
        return Path("/")


def launch_plan(
    spec: ManagedScorerProcessSpec, segment: ParentSegment | None, boot_offloaded: bool = False
) -> LaunchPlan:
    """How to start a child for `spec`: its python, environment (nothing of the trainer's import
    path) and boot config. Shared by the managed backend and `managed-scorers serve`."""
    process, scorer = spec.process, spec.scorer
    name = scorer.name.lower().replace(".", "_").replace(":", "_")
    placed = ranks.current()
    try:
        root = import_root(state_dir())
    except OSError as exc:
        raise ScorerStartupError(
            f"cannot prepare the child's import directory: {exc}",
            ChildRecord(name, None, rank=placed.rank),
        ) from exc
    return LaunchPlan(
        name=name,
        python_executable=process.python_executable,
        boot=_boot_config(spec, segment, boot_offloaded, placed.rank),
        env=_child_env(process, root, placed.gpus),
        cwd=_working_directory(),
        log_dir=process.log_dir,
        keep_logs=process.keep_logs,
        rank=placed.rank,
        startup_timeout=process.startup_timeout,
        pass_fds=(segment.child_fd,) if segment else (),
    )


def _child_env(process: ProcessConfig, root: Path, gpus: tuple[str, ...] | None) -> dict[str, str]:
    """The trainer's environment less what would steer the child, plus the spec's; its import path
    is the scorer env, our own packages, and what the spec opts into: nothing of the trainer's."""
    env = {k: v for k, v in os.environ.items() if k not in RESERVED_ENV}
    if not any(key in process.env for key in _MALLOC_ENV):
        env.update(_MALLOC_ENV)
    env.update(process.env)
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(root), *map(str, process.extra_import_paths)]),
            # no working directory on sys.path, in the child or its subprocesses
            "PYTHONSAFEPATH": "1",
            "PYTHONNOUSERSITE": "1",
            "PYTHONUNBUFFERED": "1",
            "CUDA_VISIBLE_DEVICES": child_visible_devices(
                os.environ,
                process.local_rank,
                process.visible_devices,
                process.allow_multiple_gpus,
                gpus,
            ),
        }
    )
    return env


def _boot_config(
    spec: ManagedScorerProcessSpec, segment: ParentSegment | None, boot_offloaded: bool, rank: int
) -> dict[str, Any]:
    """What the child reads on stdin before anything else (child_runtime.protocol.boot)."""
    process, scorer = spec.process, spec.scorer
    return {
        "scorer": {
            "name": scorer.name,
            "params": scorer.params,
            "revision": scorer.revision,
            "identity_hash": scorer.identity_hash,
            "catalog": scorer.catalog,
            "input_kind": scorer.input_kind,
        },
        "gpu_residency": spec.gpu_residency,
        "boot_offloaded": boot_offloaded,
        "device": scorer.device,
        "graceful_timeout_s": max(0.1, process.shutdown_timeout / 2),
        "limits": spec.limits.model_dump(),
        "shared_fd": segment.child_fd if segment else None,
        "rank": rank,
    }


@dataclass(frozen=True)
class _ChildChunks:
    """The ChunkScorer of one call: every chunk goes to the child that serves the call
    (`serving`)."""

    backend: ManagedScorerProcessBackend
    serving: Callable[[], _Generation]

    def score_chunk(self, chunk: Sequence[RewardItem], group_size: int | None) -> ChunkAnswer:
        return self.backend._score_chunk(self.serving, chunk, group_size)

    def interrupt(self) -> None:
        self.backend.interrupt()


class ManagedScorerProcessBackend(Component):
    """Starts its child on construction (unless `start=False`); `close()` always ends it.

    Thread-safe. Scoring, onload and offload are serialised per backend (the child does
    one at a time anyway, so a deadline measures service time, not queueing), and only
    they restart a dead child; health and drain never wait for a score or a restart.
    Errors always concern the generation that produced them: a call that was talking
    to a child that has since been replaced never touches the new one. Only the process
    that created the backend can use it: in a fork every call raises BackendNotOwned and
    close() leaves the child alone.
    """

    shape: ScorerShape  # what the scorer declared (its child's readiness line or /health)

    def __init__(
        self, spec: ManagedScorerProcessSpec | Mapping[str, Any], start: bool = True
    ) -> None:
        self.spec = (
            spec
            if isinstance(spec, ManagedScorerProcessSpec)
            else ManagedScorerProcessSpec.model_validate(spec)
        )
        if self.spec.replicas.size > 1:
            raise ConfigError(
                f"spec asks for {self.spec.replicas.size} replicas: build it with "
                f"supervisor.compose.replicas.ReplicatedBackend "
                "(or recipes.make_backend), which starts one child per replica"
            )
        # Which lock guards which field. `_serial` is held for a whole call (score, onload, offload,
        # drain): calls are serialised, so one thread at a time restarts a child. `_life` is held
        # only briefly, to read or swap the child generation: close() and interrupt() come from
        # other threads while a call holds `_serial`, so they never wait for it. Never take
        # `_serial` while holding `_life`. `_bytes_lock` guards the byte counters a metrics scrape
        # reads.
        self._owner_pid = os.getpid()  # immutable
        # guarded by _life (read without it by interrupt(): a snapshot)
        self._gen: _Generation | None = None
        # the child being booted; set by the booting thread,
        self._launching: ChildProcess | None = None
        # read by abort_start() from another (a snapshot: aborting a child that just became ready is
        # harmless)
        self._dead: ScorerError | None = None  # guarded by _life
        self._failed_at = 0.0  # guarded by _life
        self._restarts: list[float] = []  # guarded by _serial (only the restarting call appends)
        # guarded by _serial: calls that passed their deadline (their child was killed)
        self.timeouts = 0
        # guarded by _bytes_lock: bytes of replaced children
        self._retired_bytes: Counter[str] = Counter()
        self._bytes_lock = threading.Lock()
        self.metrics_id = prometheus.track(self)  # after the counters it reads exist
        self._closed = False  # guarded by _life (set once; read without it as a hint)
        # set by close() before it takes _life: wakes a restart's backoff
        self._closing = threading.Event()
        # guarded by _serial: what a restarted resident child should boot as
        self._want_offloaded = False
        self._life = threading.RLock()
        self._serial = threading.RLock()
        self.timings: dict[str, float] = {}
        self.required_rewards: list[str] = list(self.spec.client.required_rewards)
        self.shape = ScorerShape(self.spec.scorer.name, ())  # the child's own, once it is ready
        self.max_request_bytes = self.spec.limits.max_request_bytes
        if start:
            self.start()

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def group_size(self) -> int | None:  # type: ignore[override]  # from the config
        return self.spec.client.group_size

    @property
    def needs_start(self) -> bool:  # type: ignore[override]
        return self._gen is None and not self._closed

    def abort_start(self) -> None:
        """Kill the child `start()` (or a restart) is booting, from another thread: the boot fails
        at once."""
        child = self._launching
        if child is not None:
            child.abort()

    def owned_here(self) -> bool:
        """Whether this process created the backend (a fork of it may not use its child)."""
        return os.getpid() == self._owner_pid

    def _check_owner(self) -> None:
        if os.getpid() != self._owner_pid:
            raise BackendNotOwned(
                f"backend for scorer {self.spec.scorer.name!r} belongs to pid "
                f"{self._owner_pid}, whose child it runs; this process (pid {os.getpid()}) "
                f"is a fork of it and cannot use it: create a backend here"
            )

    def _offer_segment(self) -> ParentSegment | None:
        if self.spec.client.shared_memory_min_bytes is None:
            return None
        try:
            return ParentSegment(self.spec.limits.max_request_bytes)
        except OSError as exc:
            log.warning(
                "no shared-memory data plane for %s (%s); arrays travel in-band",
                self.spec.scorer.name,
                exc,
            )
            return None

    def _plan(self, segment: ParentSegment | None) -> LaunchPlan:
        return launch_plan(self.spec, segment, self._want_offloaded)

    def _launch(self) -> tuple[_Generation, dict[str, Any]]:
        """Spawn a child and wait until it serves; nothing is installed until it does."""
        segment = self._offer_segment()
        try:
            child = self._launching = ChildProcess(self._plan(segment))
            info = child.start()
        except BaseException:
            if segment is not None:
                segment.close()
            raise
        finally:
            self._launching = None
        if segment is not None and not info.get("shared_memory"):
            log.warning(
                "child %s refused the shared-memory data plane (%s); arrays travel in-band",
                self.spec.scorer.name,
                info.get("shared_memory_error"),
            )
            segment.close()
            segment = None
        assert child.port is not None
        client = ScorerClient.loopback(
            child.port,
            child.token,
            self.spec.process.request_timeout,
            lambda: not child.exited(),
            segment,
            self.spec.client.shared_memory_min_bytes or 0,
        )
        # every answer comes from the identity of the first child (a restart under another is
        # refused)
        client.identity = self.shape.identity_hash or info.get("identity_hash")
        self.timings["spawn_to_ready_s"] = info["spawn_to_ready_s"]
        assert child.spawned_at is not None
        warm_until = (
            child.spawned_at + self.spec.process.startup_timeout if info.get("warming") else None
        )
        return _Generation(child, client, segment, warm_until=warm_until), info

    def start(self) -> dict[str, Any]:
        """Spawn the child and wait until it serves; raises ScorerStartupError otherwise."""
        self._check_owner()
        with self._life:
            if self._gen is not None:
                raise RuntimeError(f"backend already started its child (pid {self.pid})")
            if self._closed:
                raise ScorerProcessDied("backend is closed")
            self._gen, info = self._launch()
        try:
            self.shape = ScorerShape.from_entry(info)
            self.required_rewards = check_reward_names(
                self.spec.scorer.name,
                info["terms"],
                self.spec.client.required_rewards,
                self.spec.client.weights,
            )
        except Exception:
            self.close()
            raise
        return info

    def _restart_delay(self, cause: ScorerError) -> float:
        """Seconds to wait before restarting; raises when the policy forbids a restart."""
        policy = self.spec.restart
        if isinstance(cause, ScorerCrashLoop):
            raise ScorerCrashLoop(cause.args[0].splitlines()[0], cause.record)
        # another start would boot the same other identity
        if isinstance(cause, ScorerIdentityChanged):
            raise ScorerIdentityChanged(
                cause.args[0].splitlines()[0],
                cause.record,
                url=cause.url,
                expected=cause.expected,
                got=cause.got,
            )
        if isinstance(cause, ScorerStartupError) and is_boot_failure(
            cause.boot_code if cause.boot_code is not None else cause.returncode
        ):
            raise ScorerStartupError(
                f"not restarting: the child cannot boot ({cause.args[0].splitlines()[0]})",
                cause.record,
                boot_code=cause.boot_code,
            )
        now = time.monotonic()
        recent = [t for t in self._restarts if now - t < policy.window_s]
        if len(recent) >= policy.max_restarts:
            loop = ScorerCrashLoop(
                f"child is no longer serving: {len(recent)} restarts in the last "
                f"{policy.window_s:.0f} s (max_restarts={policy.max_restarts}); last "
                f"failure: {cause.args[0].splitlines()[0]}",
                cause.record,
            )
            with self._life:
                self._dead = loop  # a crash loop stops the backend for good, not for one window
            raise loop
        return max(0.0, self._failed_at + policy.backoff_s - now)

    def _restart(self, old: _Generation, cause: ScorerError) -> _Generation:
        """Replace a dead child. Runs under the serial lock (one restarter); launches outside
        `_life`.

        A child killed because its caller was interrupted did not fail: it is replaced at once
        and does not count against the restart policy.
        """
        if not old.abandoned:
            if self._closing.wait(self._restart_delay(cause)):
                raise ScorerProcessDied("backend closed while waiting to restart", cause.record)
            self._restarts.append(time.monotonic())
        began = time.monotonic()
        old.child.finish()  # reaped (bounded) before its resources go
        self._retire(old)
        old.release()
        try:
            new, info = self._launch()
        except BaseException as exc:
            error = (
                exc
                if isinstance(exc, ScorerError)
                else ScorerStartupError(f"restart failed: {exc!r}")
            )
            with self._life:
                self._dead, self._failed_at = error, time.monotonic()
            # never turn Ctrl-C into a scorer error
            if error is exc or not isinstance(exc, Exception):
                raise
            raise error from exc
        changed = self._changed_identity(new, info)
        with self._life:
            # close() ran meanwhile, or nothing it answers may be taken
            if self._closed or changed is not None:
                record = new.child.stop(graceful_s=0.0)
                new.release()
                if changed is None:
                    raise ScorerProcessDied("backend closed during a restart", record)
                changed.record = record
                self._dead = changed  # for good: every later start boots the same other identity
                raise changed
            self._gen, self._dead = new, None
        self.timings["last_restart_s"] = time.monotonic() - began
        log.warning(
            "restarted child %s: pid %s -> %s (%d restarts)",
            self.spec.scorer.name,
            old.child.pid,
            new.child.pid,
            len(self._restarts),
        )
        return new

    def _changed_identity(
        self, new: _Generation, info: dict[str, Any]
    ) -> ScorerIdentityChanged | None:
        """A restarted child of another identity than the first (its env rebuilt with another
        revision, a file its params read changed): refused before it scores anything."""
        expected, got = self.shape.identity_hash, info.get("identity_hash")
        if expected is None or got == expected:
            return None
        return ScorerIdentityChanged(
            f"child {self.spec.scorer.name} restarted (pid {new.child.pid}) under scorer "
            f"identity {got}, not {expected} as before: its env or what its params read "
            f"changed; not started again",
            url=f"http://127.0.0.1:{new.child.port}",
            expected=expected,
            got=got if isinstance(got, str) else None,
        )

    @property
    def combination(self) -> dict[str, Any]:
        return {
            "required": list(self.required_rewards),
            "weights": dict(sorted(self.spec.client.weights.items())),
        }

    def transport_bytes(self) -> Counter[str]:
        """Request bytes sent to this backend's children so far, by path (see
        `_Generation.transport_bytes`)."""
        with self._bytes_lock:
            gen = self._gen
            live = gen.transport_bytes() if gen is not None and not gen.retired else Counter()
            return self._retired_bytes + live

    def _retire(self, gen: _Generation) -> None:
        """Move a generation's bytes into the retired counts, once, so a scrape never counts them
        twice."""
        with self._bytes_lock:
            if not gen.retired:
                self._retired_bytes.update(gen.transport_bytes())
                gen.retired = True

    @property
    def scorer_name(self) -> str:
        return self.spec.scorer.name

    @property
    def restarts(self) -> int:
        """Restarts that count against the policy (after a crash, a deadline or a bad answer)."""
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
        frozen or ignores everything is killed at the deadline, not after it. A child whose
        call was abandoned (Ctrl-C) is killed at once. In a fork of the owner, does nothing
        to the child.
        """
        if os.getpid() != self._owner_pid:
            self._closed = True  # this copy is unusable; the child is the owner's to stop
            return
        self._stop_submissions()
        self._closing.set()
        with self._life:
            if self._closed:
                return
            self._closed = True
            gen = self._gen
            if gen is None:
                return
            graceful, record = self._shut_down(gen)
        if graceful:
            self._drop_clean_log(gen, record)

    def _shut_down(self, gen: _Generation) -> tuple[bool, ChildRecord]:
        """Stops the child within `process.shutdown_timeout`: (whether it was asked to go, its
        record)."""
        started = time.monotonic()
        budget = self.spec.process.shutdown_timeout
        graceful = not gen.abandoned and self._dead is None and not gen.child.exited()
        try:
            if graceful:
                self._ask_shutdown(gen, min(SHUTDOWN_REQUEST_S, budget))
        # Ctrl-C during /shutdown: no more waiting, but the child still goes
        except BaseException:
            graceful = False
            raise
        finally:
            left = max(0.0, started + budget - time.monotonic()) if graceful else 0.0
            term = min(TERM_GRACE_S, left / 2)
            record = gen.child.stop(graceful_s=left - term, term_s=term)
            self._retire(gen)
            gen.release()
            self.timings["shutdown_s"] = time.monotonic() - started
        return graceful, record

    def _ask_shutdown(self, gen: _Generation, timeout: float) -> None:
        """/shutdown; a failed one is logged, and the stop escalates to signals."""
        try:
            gen.client.shutdown(timeout)
        except (TransportError, ErrorStatus) as exc:
            log.warning(
                "child %s pid %s: /shutdown failed (%s); escalating",
                self.spec.scorer.name,
                gen.child.pid,
                exc,
            )

    def _drop_clean_log(self, gen: _Generation, record: ChildRecord) -> None:
        """A clean run leaves nothing to read, unless `process.keep_clean_logs`."""
        if record.returncode == 0 and not self.spec.process.keep_clean_logs and gen.child.log_path:
            gen.child.log_path.unlink(missing_ok=True)

    # -- calls -----------------------------------------------------------------------------
    def _record(self) -> ChildRecord | None:
        return self._gen.child.record() if self._gen else None

    def _serving(self, restart: bool) -> _Generation:
        """The generation to call; a dead one is restarted first when `restart` allows it."""
        self._check_owner()
        with self._life:
            if self._closed:
                raise ScorerProcessDied("backend is closed", self._record())
            if self._gen is None:
                raise RuntimeError("backend was created with start=False; call start() first")
            gen, dead = self._gen, self._dead
            if dead is None:
                if gen.child.exited():
                    error = ScorerProcessDied("child exited between calls", gen.child.finish())
                    self._mark_dead(gen, error)
                    raise error
                return gen
            if not restart:
                raise type(dead)(
                    f"child is not serving (the next score or onload restarts it): "
                    f"{dead.args[0].splitlines()[0]}",
                    dead.record,
                )
        return self._restart(gen, dead)

    def _mark_dead(self, gen: _Generation, error: ScorerError) -> None:
        """If `gen` is still the current generation, the next score or onload replaces it."""
        with self._life:
            if gen is self._gen and self._dead is None:
                self._dead, self._failed_at = error, time.monotonic()

    def _exchange(self, gen: _Generation, what: str, call: Callable[..., T], *args: Any) -> T:
        try:
            return call(*args)
        except (TransportError, ErrorStatus) as exc:
            error = self._failure(gen, what, exc)
            if isinstance(error, ScorerTimeout):
                self.timeouts += 1
            raise error from exc
        # a fault in this process mid-exchange (MemoryError, a bug): state unknown
        except Exception as exc:
            raise self._failure(
                gen, what, ConnectionLost(f"failed in this process: {exc!r}")
            ) from exc
        except BaseException:  # Ctrl-C mid-call: the child is still busy with what nobody will read
            self._abandon(gen)
            raise

    def interrupt(self) -> None:
        """The caller gave up, from another thread, on a call in flight here (a panel interrupted by
        Ctrl-C): kill the child at once, as for an interrupted call of our own; the next call gets a
        new child, without counting against the restart policy."""
        gen = self._gen
        if gen is not None and os.getpid() == self._owner_pid and not gen.child.exited():
            self._abandon(gen)

    def kill_late_call(self) -> None:
        """The caller's deadline passed while the child still scores its call (a Ray pool's actor
        cancelling a late share): kill the child at once. Unlike `interrupt`, this counts against
        the restart policy, as a timeout of our own does: a scorer that hangs on every call ends in
        `ScorerCrashLoop`, not in a restart per call."""
        gen = self._gen
        if gen is not None and os.getpid() == self._owner_pid and not gen.child.exited():
            gen.child.signal_group(signal.SIGKILL)
            self.timeouts += 1
            self._mark_dead(
                gen,
                ScorerTimeout(
                    "the caller's deadline passed mid-call; its child was killed",
                    gen.child.record(),
                ),
            )

    def _abandon(self, gen: _Generation) -> None:
        """Kill the child at once (no waiting here); close() and the next call need no graceful
        path."""
        gen.abandoned = True
        gen.child.signal_group(signal.SIGKILL)
        self._mark_dead(
            gen,
            ScorerProcessDied("a call was interrupted; its child was killed", gen.child.record()),
        )

    def _failure(
        self, gen: _Generation, what: str, exc: TransportError | ErrorStatus | RewardContractError
    ) -> ScorerError:
        """What a failed exchange means for the child, and the typed error for the caller."""
        child = gen.child
        if isinstance(exc, ErrorStatus):  # the child answered: it is no longer warming
            gen.warm_until = None
            if exc.kind not in RESTART_KINDS:  # it keeps serving
                return scorer_error(exc, what, child.record())
            # wedged: restarted as after a crash
            error = scorer_error(exc, what, child.finish(), "killed")
            self._mark_dead(gen, error)
            return error
        if isinstance(exc, ConnectFailed) and not child.exited():
            # nothing reached the scorer (this process is out of descriptors, or another local
            # process floods the child's port): the child is not to blame and keeps serving
            return scorer_error(exc, what, child.record(), "serving")
        if self._closed or gen is not self._gen or self._dead is not None:
            return scorer_error(exc, what, child.record(), "gone")
        if isinstance(exc, (BadAnswer, RewardContractError)):
            died = False
        elif isinstance(exc, NoAnswer):
            died = child.exited()
        else:  # the connection broke, or none could be had
            died = child.wait_exit(DEATH_CONFIRM_S)
        error = scorer_error(exc, what, child.finish(), "died" if died else "killed")
        self._mark_dead(gen, error)
        return error

    def _score_chunk(
        self,
        serving: Callable[[], _Generation],
        chunk: Sequence[RewardItem],
        group_size: int | None,
    ) -> ChunkAnswer:
        frame = encode_chunk(chunk, group_size, self.max_request_bytes)
        gen = serving()
        timeout = gen.score_timeout(self.spec.process.request_timeout)
        answer = self._exchange(gen, "score", gen.client.score, frame, uuid.uuid4().hex, timeout)
        gen.warm_until = None  # answered: the child is warm (an error answer clears it in _failure)
        try:
            return verify_score_answer(
                answer, [item.id for item in chunk], self.required_rewards, declared=self.shape
            )
        except RewardContractError as exc:
            raise self._failure(gen, "score", exc) from exc

    def score(self, request: RewardRequest) -> Outcome:
        """Every chunk of one call goes to the same child: one that dies mid-call fails the call
        (its other chunks are never sent to a replacement behind the caller's back)."""
        return self.score_batched(request, self.spec.client.request_batch_size)

    def score_batched(self, request: RewardRequest, batch_size: int) -> Outcome:
        """`score`, its chunks of at most `batch_size` items (a `BatchView` sharing this child)."""
        self._check_owner()
        with self._serial:
            serving = _once(lambda: self._serving(restart=True))
            client = self.spec.client
            plan = CallPlan(
                self.shape,
                batch_size,
                self.required_rewards,
                client.weights,
                client.group_size,
                time_chunks=client.time_chunks,
            )
            outcome = score_in_chunks(request, plan, _ChildChunks(self, serving))
            # named with the child
            if outcome.kind == "terms_failed" and outcome.response is not None:
                named = ScorerTermsFailed(
                    str(outcome.error), dict(outcome.failed), outcome.response, self._record()
                )
                return Outcome.terms_failed(named, outcome.response)
            return outcome

    def onload(self) -> dict[str, Any]:
        """Restarts a dead child (booting it resident), then onloads; waits for a running score."""
        self._check_owner()
        with self._serial:
            self._want_offloaded = False  # a restart for this onload boots resident
            gen = self._serving(restart=True)
            return self._exchange(gen, "onload", gen.client.onload)

    def offload(self) -> dict[str, Any]:
        """Waits for a running score, then offloads. A restarted child boots offloaded only if this
        one reported that it is (a scorer that cannot offload stays resident)."""
        self._check_owner()
        with self._serial:
            gen = self._serving(restart=False)
            try:
                figures = self._exchange(gen, "offload", gen.client.offload)
            except ScorerRequestError as exc:
                # the model's close() raised, but it was released: offloaded
                if exc.kind == CLOSE_FAILED:
                    self._want_offloaded = True
                raise
            self._want_offloaded = figures.get("residency") == "offloaded"
            return figures

    @property
    def call_bound_s(self) -> float:
        """A restart's boot plus one request."""
        return float(self.spec.process.startup_timeout + self.spec.process.request_timeout)

    def arena(self) -> Arena:
        """Arrays in the current child's shared segment (scored in place); ordinary memory when
        the child has no segment. After a restart, older arena arrays are copied like any other."""
        gen = self._gen
        if gen is not None and gen.segment is not None and gen.segment.fd >= 0:
            return SharedArena(gen.segment)
        return HeapArena()

    def health(self) -> dict[str, Any]:
        gen = self._serving(restart=False)
        return self._exchange(gen, "health", gen.client.health)

    def warming(self) -> bool:
        """The child said ready while still warming (a math grader's workers) and its /health does
        not say yet that it is warm. A child that cannot answer is not warming: its failure is
        recorded (the next call restarts it and says why) and logged here."""
        gen = self._gen
        if gen is None or gen.warm_until is None:
            return False
        if time.monotonic() - gen.warm_asked < WARM_ASK_S:
            return gen.warming_said
        gen.warm_asked = time.monotonic()
        try:
            warm = not self.health().get("warming", False)
        except ScorerError as exc:
            if gen.warming_said:  # once per failure, not at every poll
                log.warning(
                    "child %s: /health failed while warming: %s",
                    self.spec.scorer.name,
                    str(exc).splitlines()[0],
                )
            gen.warming_said = False
            return False
        if warm:
            gen.warm_until = None  # no longer a start the next request must wait for
        gen.warming_said = not warm
        return not warm

    def drain(self, timeout_s: float | None = None) -> dict[str, Any]:
        bound = timeout_s if timeout_s is not None else self.spec.process.request_timeout
        gen = self._serving(restart=False)
        return self._exchange(gen, "drain", gen.client.drain, bound)
