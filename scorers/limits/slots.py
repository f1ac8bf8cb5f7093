"""Requests in flight to one endpoint, across the node: N slot files, each held by `flock`.

A call holds one slot from before its request until its answer is read. The kernel drops a flock
when its holder dies however it dies, so a rank killed -9 mid-call gives its slot back at once:
no lease outlives its process. Each slot file holds its holder's pid (the deadline's error names
who held them). In one process each slot file is opened once and guarded by a thread lock (flock
is per open file, so threads would share it); a forked child forgets the parent's files, never
unlocking them. Waiting is a poll (flock cannot wait with a deadline), from 2 ms up to 25 ms apart,
jittered. Stdlib only.
"""

from __future__ import annotations

import fcntl
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from scorers.limits.rundir import open_private

POLL_S = (0.002, 0.025)


@dataclass
class _Slot:
    path: Path
    fd: int = -1
    held: threading.Lock = field(default_factory=threading.Lock)


_registry: dict[str, _Slot] = {}
_registry_lock = threading.Lock()


def _forget_after_fork() -> None:
    """In a forked child: the parent's slot files are the parent's (closing our copies of the fds
    leaves its locks alone); the child opens its own."""
    global _registry_lock
    for slot in _registry.values():
        if slot.fd >= 0:
            os.close(slot.fd)
    _registry.clear()
    _registry_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def _slot(path: Path) -> _Slot:
    with _registry_lock:
        slot = _registry.get(str(path))
        if slot is None:
            slot = _registry[str(path)] = _Slot(path, open_private(path))
        return slot


class Slots:
    """`count` slot files at `base.slot-<i>`."""

    def __init__(self, base: Path, count: int) -> None:
        self._slots = [_slot(Path(f"{base}.slot-{i}")) for i in range(count)]

    def try_take(self, usable: int) -> int | None:
        """A free slot among the first `usable`, held now; None if all are held."""
        start = random.randrange(usable)
        for offset in range(usable):
            index = (start + offset) % usable
            if self._lock(index):
                self._mark(index)
                return index
        return None

    def try_take_counted(self, usable: int) -> int | None:
        """A free slot among the first `usable`, held now, only if fewer than `usable` slots are
        held in all: a window that shrank still counts the calls in slots past it (the adaptive
        window's rule; each slot is probed, one flock each). Callers probing at once each see
        the others' probes as held slots (they may wait a poll for nothing), and may each see
        room for one: the window is then passed by up to as many calls as probed together."""
        held, mine = 0, None
        try:
            for index in range(len(self._slots)):
                if not self._lock(index):
                    held += 1
                elif mine is None and index < usable:
                    mine = index
                else:
                    self.give(index)
            if mine is not None and held < usable:
                self._mark(mine)
                return mine
        except BaseException:
            if mine is not None:
                self.give(mine)
            raise
        if mine is not None:
            self.give(mine)
        return None

    def _lock(self, index: int) -> bool:
        """Slot `index` held now, by this thread (its lock) and this process (its flock); False if
        another thread or process holds it."""
        slot = self._slots[index]
        if not slot.held.acquire(blocking=False):
            return False
        try:
            fcntl.flock(slot.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            slot.held.release()
            return False
        except BaseException:
            slot.held.release()
            raise
        return True

    def _mark(self, index: int) -> None:
        """The holder's pid in the slot's file (`holders`, for error messages)."""
        os.pwrite(self._slots[index].fd, f"{os.getpid():<12}".encode(), 0)

    def take(
        self,
        usable: Callable[[], int],
        deadline: float,
        counted: bool = False,
        on_full: Callable[[], None] | None = None,
    ) -> int | None:
        """A slot, waited for until `deadline`; None if none came free by then. `on_full` is
        called once, when the first try finds every usable slot held."""
        pause = POLL_S[0]
        while True:
            window = min(usable(), len(self._slots))
            index = self.try_take_counted(window) if counted else self.try_take(window)
            if index is not None:
                return index
            if on_full is not None and pause == POLL_S[0]:
                on_full()
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(pause * random.uniform(0.5, 1.0), left))
            pause = min(pause * 2, POLL_S[1])

    def give(self, index: int) -> None:
        slot = self._slots[index]
        fcntl.flock(slot.fd, fcntl.LOCK_UN)
        slot.held.release()

    def holders(self) -> list[int]:
        """The pids written in the slot files (the last holder of each; for error messages)."""
        pids = []
        for slot in self._slots:
            text = os.pread(slot.fd, 12, 0).decode("ascii", "replace").strip()
            if text.isdigit():
                pids.append(int(text))
        return sorted(set(pids))
