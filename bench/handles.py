"""Typed handles on a started managed backend's internals, for measurements and fault injection."""

from __future__ import annotations

from supervisor import ManagedScorerProcessBackend, RewardBackend
from supervisor.child.client import ScorerClient
from supervisor.child.process import ChildProcess
from supervisor.child.segment import ParentSegment


def managed_of(backend: RewardBackend) -> ManagedScorerProcessBackend:
    if not isinstance(backend, ManagedScorerProcessBackend):
        raise TypeError(f"expected a managed backend, got {type(backend).__name__}")
    return backend


def child_of(backend: RewardBackend) -> ChildProcess:
    child = managed_of(backend)._child
    if child is None:
        raise RuntimeError("the backend has not started a child")
    return child


def pid_of(backend: RewardBackend) -> int:
    """The pid of a started backend's current child."""
    pid = child_of(backend).pid
    if pid is None:
        raise RuntimeError("the child was never spawned")
    return pid


def port_of(backend: RewardBackend) -> int:
    port = child_of(backend).port
    if port is None:
        raise RuntimeError("the child has no port")
    return port


def client_of(backend: RewardBackend) -> ScorerClient:
    gen = managed_of(backend)._gen
    if gen is None:
        raise RuntimeError("the backend has not started a child")
    return gen.client


def segment_of(backend: RewardBackend) -> ParentSegment:
    gen = managed_of(backend)._gen
    if gen is None or gen.segment is None:
        raise RuntimeError("the backend's child has no shared segment")
    return gen.segment
