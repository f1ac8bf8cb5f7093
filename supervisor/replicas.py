"""ReplicatedBackend: one term backed by N children of one scorer, each narrowed to its own device.

Why: a rank with more devices than its policy needs (or a CPU scorer slower than generation)
scores faster with the batch spread over several children. Each replica is an ordinary
ManagedScorerProcessBackend (its own restarts, deadlines and metrics); this class only
splits a request along group boundaries, runs the shares concurrently and joins the answers.
A replica's failure fails the call with its own typed error, naming the replica and its share.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from scorers.diagnostics import merge_term_reports
from scorers.groups import GroupInputError, partition
from supervisor.backend import RewardBackend, ScorerShape, request_group_size
from supervisor.config import ManagedScorerProcessSpec, ReplicasConfig
from supervisor.errors import ScorerError, ScorerRequestError
from supervisor.joined import join_rows, rows_by_id
from supervisor.managed import ManagedScorerProcessBackend
from supervisor.types import RewardRequest, RewardResponse

T = TypeVar("T")


def replica_specs(spec: ManagedScorerProcessSpec) -> list[ManagedScorerProcessSpec]:
    """One spec per replica: the same scorer, each narrowed to its listed device (if any)."""
    single = ReplicasConfig()
    if not spec.replicas.devices:
        return [spec.model_copy(update={"replicas": single}) for _ in range(spec.replicas.count)]
    return [
        spec.model_copy(
            update={
                "replicas": single,
                "process": spec.process.model_copy(update={"visible_devices": device, "allow_multiple_gpus": False}),
            }
        )
        for device in spec.replicas.devices
    ]


class ReplicatedBackend(RewardBackend):
    """`spec.replicas.size` managed children of one scorer, started concurrently; thread-safe."""

    def __init__(self, spec: ManagedScorerProcessSpec | Mapping[str, Any], start: bool = True) -> None:
        self.spec = (
            spec if isinstance(spec, ManagedScorerProcessSpec) else ManagedScorerProcessSpec.model_validate(spec)
        )
        self.devices: list[str | None] = [*self.spec.replicas.devices] or [None] * self.spec.replicas.count
        self.replicas = [ManagedScorerProcessBackend(s, start=False) for s in replica_specs(self.spec)]
        self._load = [0] * len(self.replicas)  # items in flight per replica (least_loaded reads it)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=len(self.replicas), thread_name_prefix="replica")
        self._closed = False
        if start:
            self.start()

    def _each(self, call: Callable[[ManagedScorerProcessBackend], T]) -> list[T | BaseException]:
        """`call` on every replica at once; each one's result or its exception, in replica order."""
        futures = [self._pool.submit(call, replica) for replica in self.replicas]
        outcomes: list[T | BaseException] = []
        for future in futures:
            error = future.exception()
            outcomes.append(error if error is not None else future.result())
        return outcomes

    def _raise_first(self, outcomes: Sequence[Any], what: str, shares: Sequence[Sequence[str]] | None = None) -> None:
        failed = [(index, outcome) for index, outcome in enumerate(outcomes) if isinstance(outcome, BaseException)]
        if not failed:
            return
        index, error = failed[0]
        if isinstance(error, ScorerError):  # the same type, named: callers (panels) classify it as before
            share = f", share of {len(shares[index])} ids from {shares[index][0]!r}" if shares else ""
            others = f"; {len(failed) - 1} other replica(s) failed too" if len(failed) > 1 else ""
            error.args = (f"{self.describe(index)}{share}: {what}: {error.args[0]}{others}", *error.args[1:])
            error.replica = index  # type: ignore[attr-defined]
        raise error

    def describe(self, index: int) -> str:
        device = f", device {self.devices[index]}" if self.devices[index] is not None else ""
        pid = self.replicas[index].pid
        return f"replica {index}/{len(self.replicas)} of {self.shape.name!r} (pid {pid}{device})"

    def start(self) -> None:
        """Start every replica at once (not one after another); if any cannot start, none is left running."""
        outcomes = self._each(lambda replica: replica.start())
        try:
            self._raise_first(outcomes, "start")
        except BaseException:
            self.close()
            raise

    @property
    def shape(self) -> ScorerShape:  # type: ignore[override]  # every replica runs the same scorer
        return self.replicas[0].shape

    @property
    def group_size(self) -> int | None:  # type: ignore[override]  # from the config
        return self.spec.client.group_size

    @property
    def combination(self) -> dict[str, Any]:
        return self.replicas[0].combination

    @property
    def required_rewards(self) -> list[str]:
        return self.replicas[0].required_rewards

    def _check_owner(self) -> None:
        self.replicas[0]._check_owner()

    # -- scoring ---------------------------------------------------------------------------
    def _split(self, request: RewardRequest, group_size: int | None) -> list[list[int]]:
        """Item positions per replica; a group is never cut."""
        shape = self.shape
        try:
            groups = partition(
                request.items, group_size, scorer=shape.name, groupwise=shape.groupwise, ragged=shape.ragged_groups
            )
        except GroupInputError as exc:
            raise ScorerRequestError(str(exc), kind="bad_input") from exc
        shares: list[list[int]] = [[] for _ in self.replicas]
        if self.spec.replicas.split == "least_loaded":
            with self._lock:
                load = list(self._load)
                for members in sorted(groups, key=len, reverse=True):
                    target = min(range(len(load)), key=lambda i: (load[i], i))
                    shares[target].extend(members)
                    load[target] += len(members)
            return [sorted(share) for share in shares]
        per, filled, target = len(request.items) / len(self.replicas), 0, 0
        for members in groups:  # equal runs in request order, cut only between groups
            while target < len(self.replicas) - 1 and filled >= per * (target + 1):
                target += 1
            shares[target].extend(members)
            filled += len(members)
        return [sorted(share) for share in shares]

    def compute_rewards(self, request: RewardRequest) -> RewardResponse:
        self._check_owner()
        group_size = request_group_size(request, self.spec.client.group_size)
        shares = self._split(request, group_size)
        with self._lock:
            for index, share in enumerate(shares):
                self._load[index] += len(share)

        def one(index: int) -> RewardResponse | None:
            try:
                if not shares[index]:
                    return None
                items = [request.items[p] for p in shares[index]]
                return self.replicas[index].compute_rewards(RewardRequest(items=items, group_size=group_size))
            finally:
                with self._lock:
                    self._load[index] -= len(shares[index])

        futures = [self._pool.submit(one, index) for index in range(len(self.replicas))]
        outcomes: list[Any] = []
        for future in futures:  # every share finishes (or fails) before the call returns: nothing left running
            error = future.exception()
            outcomes.append(error if error is not None else future.result())
        ids = [[request.items[p].id for p in share] for share in shares]
        self._raise_first(outcomes, "score", ids)
        responses = [outcome for outcome in outcomes if outcome is not None]
        return join_rows(request.ids, rows_by_id(responses), merge_term_reports(r.diagnostics for r in responses))

    # -- residency and lifecycle: every replica --------------------------------------------
    def _all(self, what: str, call: Callable[[ManagedScorerProcessBackend], dict[str, Any]]) -> dict[str, Any]:
        outcomes = self._each(call)
        self._raise_first(outcomes, what)
        return {"replicas": outcomes}

    def onload(self) -> dict[str, Any]:
        return self._all("onload", lambda replica: replica.onload())

    def offload(self) -> dict[str, Any]:
        return self._all("offload", lambda replica: replica.offload())

    def drain(self) -> dict[str, Any]:
        return self._all("drain", lambda replica: replica.drain())

    def interrupt(self) -> None:
        for replica in self.replicas:
            replica.interrupt()

    @property
    def pids(self) -> list[int | None]:
        return [replica.pid for replica in self.replicas]

    def close(self) -> None:
        """Closes every replica, concurrently (one shutdown deadline for all, not N of them); idempotent.
        In a fork of the owner it only marks the replicas closed: their children are the owner's."""
        self._stop_submissions()
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if not self.replicas[0].owned_here():  # a fork: the pool's threads did not come along
            for replica in self.replicas:
                replica.close()
            return
        self._each(lambda replica: replica.close())
        self._pool.shutdown(wait=False)
