"""ScorerHost: the one owner of the scorer inside the child.

Residency changes exclude scoring, so an offload can never pull weights out from under a
running batch. Scoring itself is serialised too, except for a resident scorer that declares
`concurrent_calls` > 1: up to that many of its calls run at once (a residency change waits
for them, and new calls wait for a residency change that is waiting).

A scorer that raises `ScorerWedged` (a call left work running past its deadline on a thread it
cannot stop) is never called again: every later call, wake or sleep is refused at once as never
started, until the parent restarts the child.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from scorers.base import CloseFailed, ScoreItem, Scorer, ScoreResult, ScorerWedged, score_checked

log = logging.getLogger(__name__)

RESIDENT = "resident"
PER_CALL = "per_call"
GPU_RESIDENCY_MODES = (RESIDENT, PER_CALL)


class ResidencyConflict(RuntimeError):
    """A score arrived for a `resident` scorer that is offloaded (answered 409)."""


class ResidencyFailed(RuntimeError):
    """A per-call wake (onload) or sleep (offload) around a score failed: a lifecycle failure,
    answered with its own kind so the parent never takes it for one batch's scoring error."""


class _ScoringLock:
    """Up to `calls` scorers' calls at once, or one residency change alone; a waiting change goes
    before calls that arrive after it."""

    def __init__(self, calls: int) -> None:
        self._calls = calls
        self._scoring = 0
        self._changing = False
        self._changes_waiting = 0
        self._cond = threading.Condition()

    @contextmanager
    def scoring(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(
                lambda: (
                    not self._changing and not self._changes_waiting and self._scoring < self._calls
                )
            )
            self._scoring += 1
        try:
            yield
        finally:
            with self._cond:
                self._scoring -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self, timeout_s: float | None = None) -> Iterator[None]:
        """Alone; TimeoutError when `timeout_s` passes first."""
        with self._cond:
            self._changes_waiting += 1
            try:
                if not self._cond.wait_for(
                    lambda: not self._changing and not self._scoring, timeout_s
                ):
                    raise TimeoutError
            finally:
                self._changes_waiting -= 1
            self._changing = True
        try:
            yield
        finally:
            with self._cond:
                self._changing = False
                self._cond.notify_all()


class ScorerHost:
    def __init__(self, scorer: Scorer, gpu_residency: str, identity_hash: str = "") -> None:
        """Refuses per_call for a scorer that cannot offload: checked before any weights load."""
        if gpu_residency not in GPU_RESIDENCY_MODES:
            raise ValueError(
                f"gpu_residency must be one of {GPU_RESIDENCY_MODES}, got {gpu_residency!r}"
            )
        if gpu_residency == PER_CALL and not scorer.spec.supports_offload:
            raise ValueError(
                f"gpu_residency=per_call needs a scorer that supports offload; "
                f"{scorer.spec.name!r} does not (use resident)"
            )
        self.scorer = scorer
        self.identity_hash = identity_hash
        self.gpu_residency = gpu_residency
        self.residency = "offloaded"
        # residency changes, by the state reached (for /metrics)
        self.transitions: Counter[str] = Counter()
        self.load_s = 0.0  # the scorer's load() (and boot onload), for the readiness line
        # why the scorer can serve no more (the first ScorerWedged it raised)
        self.wedged: str | None = None
        # per_call residency changes residency around every call: its calls are one at a time
        self.concurrent_calls = (
            max(1, scorer.spec.concurrent_calls) if gpu_residency == RESIDENT else 1
        )
        self._lock = _ScoringLock(self.concurrent_calls)

    def catalog_entry(self) -> dict[str, Any]:
        """What this child serves, on the readiness line and /health: the parent checks it."""
        spec = self.scorer.spec
        return {
            "scorer": spec.name,
            "revision": spec.revision,
            "identity_hash": self.identity_hash,
            "input_kind": spec.input_kind,
            "terms": list(spec.term_names()),
            "diagnostics": list(spec.diagnostics),
            "details": list(spec.details),
            "groupwise": spec.groupwise,
            "ragged_groups": spec.ragged_groups,
            "per_candidate": spec.per_candidate,
            "required_fields": list(spec.required_fields),
            "concurrent_calls": self.concurrent_calls,
            "reward_term": spec.reward_term,
            # what the hash covers beyond names (a served panel: each term's identity)
            "identity": spec.identity,
        }

    def _become(self, state: str) -> None:
        # a new Counter each time: /metrics reads it from another thread
        if state != self.residency:
            self.transitions = self.transitions + Counter({state: 1})
        self.residency = state

    def _onload_locked(self) -> dict[str, Any]:
        if self.residency == "resident":
            return {"changed": False}
        try:
            figures = dict(self.scorer.onload() or {})
        except BaseException:
            self._become("unknown")  # weights may be half on the device
            raise
        self._become("resident")
        return {"changed": True, **figures}

    def _offload_locked(self) -> dict[str, Any]:
        if not self.scorer.spec.supports_offload:
            return {"changed": False, "supports_offload": False}
        if self.residency == "offloaded":
            return {"changed": False}
        try:
            figures = dict(self.scorer.offload() or {})
        # the model's close() raised, but it was released: offloaded all the same
        except CloseFailed:
            self._become("offloaded")
            raise
        except BaseException:
            self._become("unknown")
            raise
        self._become("offloaded")
        return {"changed": True, **figures}

    def _residency_change(self, change: Callable[[], dict[str, Any]], what: str) -> None:
        try:
            change()
        # not a failed residency change: the model's own error, answered as such
        except CloseFailed:
            raise
        except Exception as exc:
            raise ResidencyFailed(
                f"per-call {what} of scorer {self.scorer.spec.name!r} failed: {exc!r}"
            ) from exc

    def _refuse_if_wedged(self, what: str) -> None:
        if self.wedged is not None:
            raise ScorerWedged(
                f"{what} of scorer {self.scorer.spec.name!r} never started: the scorer is "
                f"wedged ({self.wedged}); "
                "this child must be restarted",
                timed_out=False,
            )

    def _scored(
        self, items: Sequence[ScoreItem], group_size: int | None, terms: Sequence[str] | None
    ) -> ScoreResult:
        try:
            return score_checked(self.scorer, items, group_size, terms)
        except ScorerWedged as exc:
            if self.wedged is None:
                self.wedged = str(exc).splitlines()[0]
            raise

    def onload(self) -> dict[str, Any]:
        with self._lock.exclusive():
            self._refuse_if_wedged("onload")
            return self._onload_locked()

    def offload(self) -> dict[str, Any]:
        with self._lock.exclusive():
            self._refuse_if_wedged("offload")
            return self._offload_locked()

    def close(self, timeout_s: float) -> None:
        """Close the scorer once no batch is running; past the bound, leave it to the group kill. A
        wedged scorer is not closed: its stuck threads may hold what close() would wait for."""
        if self.wedged is not None:
            log.warning(
                "scorer %s is wedged (%s); exiting without close()",
                self.scorer.spec.name,
                self.wedged,
            )
            return
        try:
            with self._lock.exclusive(timeout_s):
                self.scorer.close()
        except TimeoutError:
            log.warning(
                "scorer %s still busy after %.1f s; exiting without close()",
                self.scorer.spec.name,
                timeout_s,
            )

    def score(
        self,
        items: Sequence[ScoreItem],
        group_size: int | None = None,
        terms: Sequence[str] | None = None,
    ) -> ScoreResult:
        """`terms`: the ones the request wants (None: all)."""
        with self._lock.scoring():
            self._refuse_if_wedged("score")
            if self.gpu_residency == PER_CALL:
                try:
                    self._residency_change(self._onload_locked, "onload")
                    return self._scored(items, group_size, terms)
                # also after a failed onload: nothing stays half on the device (unless wedged)
                finally:
                    if self.wedged is None:
                        self._residency_change(self._offload_locked, "offload")
            if self.residency == "unknown":
                raise ResidencyConflict(
                    f"scorer {self.scorer.spec.name!r} residency is unknown after a failed "
                    "onload/offload; POST /onload or /offload to recover"
                )
            if self.residency != "resident":
                raise ResidencyConflict(
                    f"scorer {self.scorer.spec.name!r} is offloaded; POST /onload first "
                    "(gpu_residency=resident never onloads implicitly)"
                )
            return self._scored(items, group_size, terms)
