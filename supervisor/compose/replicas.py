"""ReplicatedBackend: one term backed by N children of one scorer, each narrowed to its own device.

Why: a rank with more devices than its policy needs (or a CPU scorer slower than generation)
scores faster with the batch spread over several children. Each replica is an ordinary
ManagedScorerProcessBackend (its own restarts, deadlines, metrics and submission worker); this
class only splits a request along group boundaries, hands each share to its replica's own
worker (so calls from several threads never queue behind another replica) and joins the answers.
A replica's failure fails the call with its own typed error, naming the replica and its share.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

from scorers.groups import share_groups
from supervisor.backends.managed import ManagedScorerProcessBackend
from supervisor.child import ranks
from supervisor.chunks import request_group_size, request_groups
from supervisor.compose.build import build_all
from supervisor.composition import Component
from supervisor.config import ManagedScorerProcessSpec, ReplicasConfig
from supervisor.errors import ConfigError, ScorerProcessDied, prefixed
from supervisor.fanout import on_each
from supervisor.joined import join_shares
from supervisor.outcome import Outcome
from supervisor.shape import ScorerShape
from supervisor.submit import Submission
from supervisor.types import RewardRequest, RewardResponse


def replica_devices(
    config: ReplicasConfig, env: Mapping[str, str] | None = None
) -> list[str | None]:
    """The GPU each replica is narrowed to. Listed devices are CUDA ordinals as this process sees
    them (`cuda:0` is the first GPU it was given: a Ray actor's, or the first of its
    CUDA_VISIBLE_DEVICES); None: narrowed like a single child (N on CPU)."""
    if not config.devices:
        return [None] * config.count
    env = os.environ if env is None else env
    placed = ranks.current(env)
    if placed.gpus is not None:
        given: list[str] | None = list(placed.gpus)
    else:
        if placed.launcher == "torchrun" and placed.local_world_size > 1:
            raise ConfigError(
                f"replicas.devices {config.devices} under torchrun with "
                f"{placed.local_world_size} ranks on this "
                "node: each rank owns one GPU, so replicas of every rank would share the "
                "same ones; use replicas.count, or one rank per node that owns its GPUs"
            )
        visible = env.get("CUDA_VISIBLE_DEVICES")
        given = (
            [e.strip() for e in visible.split(",") if e.strip()] if visible is not None else None
        )
    found: list[str | None] = []
    for device in config.devices:
        ordinal = device.removeprefix("cuda:")
        if not ordinal.isdigit():
            raise ConfigError(
                f"replicas.devices entry {device!r} is not a CUDA ordinal (0, 1, ... or cuda:N)"
            )
        if given is None:
            found.append(ordinal)
        elif int(ordinal) < len(given):
            found.append(given[int(ordinal)])
        else:
            raise ConfigError(
                f"replicas.devices entry {device!r}: this process was given only GPUs {given}"
            )
    return found


def replica_specs(spec: ManagedScorerProcessSpec) -> list[ManagedScorerProcessSpec]:
    """One spec per replica: the same scorer, each narrowed to its device (if listed)."""
    single = ReplicasConfig()
    specs = []
    for device in replica_devices(spec.replicas):
        process = spec.process
        if device is not None:
            process = process.model_copy(
                update={"visible_devices": device, "allow_multiple_gpus": False}
            )
        specs.append(spec.model_copy(update={"replicas": single, "process": process}))
    return specs


class ReplicatedBackend(Component):
    """`spec.replicas.size` managed children of one scorer, started concurrently; thread-safe."""

    def __init__(
        self, spec: ManagedScorerProcessSpec | Mapping[str, Any], start: bool = True
    ) -> None:
        self.spec = (
            spec
            if isinstance(spec, ManagedScorerProcessSpec)
            else ManagedScorerProcessSpec.model_validate(spec)
        )
        self.devices = replica_devices(self.spec.replicas)
        self.replicas = [
            ManagedScorerProcessBackend(s, start=False) for s in replica_specs(self.spec)
        ]
        # items sent and not answered, per replica (least_loaded)
        self._load = [0] * len(self.replicas)
        self._lock = threading.Lock()
        self._started = False
        self._closed = False
        self._close_done = threading.Event()
        if start:
            self.start()

    @property
    def needs_start(self) -> bool:  # type: ignore[override]
        return not self._started and not self._closed

    def start(self) -> None:
        """Start every replica at once; if any cannot start (or Ctrl-C), none is left running."""
        with self._lock:
            if self._started:
                raise RuntimeError(f"replicated backend of {self.shape.name!r} already started")
            if self._closed:
                raise ScorerProcessDied("backend is closed")
            self._started = True
        try:
            build_all([lambda replica=replica: replica for replica in self.replicas])  # type: ignore[misc]
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

    @property
    def pids(self) -> list[int | None]:
        return [replica.pid for replica in self.replicas]

    def _check_owner(self) -> None:
        self.replicas[0]._check_owner()

    def describe(self, index: int, error: BaseException | None = None) -> str:
        record = getattr(error, "record", None)
        pid = record.pid if record is not None else self.replicas[index].pid
        device = f", device {self.devices[index]}" if self.devices[index] is not None else ""
        return f"replica {index}/{len(self.replicas)} of {self.shape.name!r} (pid {pid}{device})"

    # -- scoring ---------------------------------------------------------------------------
    def _split(self, request: RewardRequest, group_size: int | None) -> list[list[int]]:
        """Item positions per replica, never cutting a group; the shares' loads are counted here,
        in the same critical section that reads them (least_loaded)."""
        groups = request_groups(request, self.shape, group_size)
        with self._lock:
            shares = share_groups(groups, self._load, self.spec.replicas.split == "least_loaded")
            for index, share in enumerate(shares):
                self._load[index] += len(share)
        return shares

    def score(self, request: RewardRequest) -> Outcome:
        self._check_owner()
        if self._closed:
            raise ScorerProcessDied(f"replicated backend of {self.shape.name!r} is closed")
        group_size = request_group_size(request, self.spec.client.group_size)
        shares = self._split(request, group_size)
        futures: dict[int, Future[RewardResponse]] = {}
        try:
            for index, share in enumerate(shares):
                if share:
                    items = [request.items[p] for p in share]
                    future = self.replicas[index].submit(
                        RewardRequest(items=items, group_size=group_size, step=request.step)
                    )
                    # on the replica's own worker: in order, never behind another replica
                    futures[index] = future
                    future.add_done_callback(self._unload(index, len(share)))
            for future in futures.values():
                future.exception()  # bounded by the request deadline
        # Ctrl-C while the shares run: never leave them scoring behind the caller
        except BaseException:
            for sent in futures.values():
                sent.cancel()
            self.interrupt()
            raise
        finally:
            for index, share in enumerate(shares):
                if share and index not in futures:  # never sent: its load goes now
                    self._answered(index, len(share))
        indexes = list(futures)
        outcomes = [_ended(futures[index]) for index in indexes]

        def named(position: int, error: BaseException, others: int) -> BaseException:
            ids = [request.items[p].id for p in shares[indexes[position]]]
            return self._named(
                indexes[position], error, f"share of {len(ids)} ids from {ids[0]!r}", others
            )

        return join_shares(self.shape.name, request.ids, outcomes, named)

    def _answered(self, index: int, items: int) -> None:
        with self._lock:
            self._load[index] -= items

    def _unload(self, index: int, items: int) -> Callable[[Future[RewardResponse]], None]:
        return lambda _future: self._answered(index, items)

    def _named(self, index: int, error: BaseException, what: str, others: int) -> BaseException:
        """`error` prefixed with the replica (see errors.prefixed)."""
        also = f"; {others} other replica(s) failed too" if others else ""
        return prefixed(error, f"{self.describe(index, error)}, {what}{also}")

    # -- residency and lifecycle: every replica --------------------------------------------
    def _all(
        self, what: str, call: Callable[[ManagedScorerProcessBackend], dict[str, Any]]
    ) -> dict[str, Any]:
        outcomes = on_each(self.replicas, call)
        for index, outcome in enumerate(outcomes):
            if isinstance(outcome, BaseException):
                raise self._named(index, outcome, what, 0) from outcome
        return {"replicas": outcomes}

    def members(self) -> list[ManagedScorerProcessBackend]:
        return list(self.replicas)

    def onload(self) -> dict[str, Any]:
        return self._all("onload", lambda replica: replica.onload())

    def offload(self) -> dict[str, Any]:
        return self._all("offload", lambda replica: replica.offload())

    def drain(self) -> dict[str, Any]:
        return self._all("drain", lambda replica: replica.drain())

    def interrupt(self) -> None:
        for replica in self.replicas:
            replica.interrupt()

    def abort_start(self) -> None:
        for replica in self.replicas:
            replica.abort_start()

    def close(self) -> None:
        """Closes every replica at once (one shutdown deadline for all, not N); a second caller
        waits for the first. In a fork of the owner it only marks the replicas closed."""
        # before any lock: one held at the fork stays held here
        if not self.replicas[0].owned_here():
            self._closed = True
            for replica in self.replicas:
                replica.close()
            return
        self._stop_submissions()
        with self._lock:
            first = not self._closed
            self._closed = True
        if not first:
            self._close_done.wait()
            return
        try:
            on_each(self.replicas, lambda replica: replica.close())
        finally:
            self._close_done.set()


def _ended(future: Future[RewardResponse]) -> Outcome:
    """A replica's share as a value, once its submission ended (a submission keeps its outcome)."""
    if isinstance(future, Submission) and future.outcome is not None:
        return future.outcome
    error = future.exception()
    return Outcome.raised(error) if error is not None else Outcome.scored(future.result())
