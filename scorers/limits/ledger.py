"""One endpoint's shared record on this node: a small file read and written under `flock`.

The record is the declared limits and the `Levels` (JSON, padded to a fixed size and written with
one `pwrite` at offset 0, so a writer killed -9 leaves the old record or the new one, never half).
A process that uses the endpoint holds a shared lock on a second file (`.users`) from `open` to
`close`; the kernel drops it when the process dies however it dies. A process that finds no other
user writes its declaration; one that finds users checks that they declared the same limits
(`LimitConflict` otherwise), so a change of limits takes effect once every old user is gone.
Stdlib only.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scorers.limits.bucket import Levels
from scorers.limits.declared import EndpointLimit
from scorers.limits.errors import LimitConflict, LimitStateError
from scorers.limits.rundir import open_private

RECORD_BYTES = 1024  # within one page: one pwrite is whole or absent
LOCK_WAIT_S = 30.0  # a holder keeps the lock for microseconds; longer is a stopped process


@dataclass
class Record:
    declared: dict[str, Any] | None
    levels: Levels | None


class Ledger:
    """The record of `limit`'s endpoint at `base` (+ `.state`, `.users`), for one process."""

    def __init__(self, base: Path, limit: EndpointLimit) -> None:
        self.limit, self.path = limit, Path(f"{base}.state")
        self._fd = open_private(self.path)
        self._users = open_private(Path(f"{base}.users"))
        self._threads = threading.Lock()  # flock is per open file: threads of one process too
        self._closed = False
        _open_ledgers.add(self)

    def close(self) -> None:
        with self._threads:
            self._forget()

    def _forget(self) -> None:
        """Close the files once (our share of the users' lock goes with them)."""
        if not self._closed:
            self._closed = True
            os.close(self._users)
            os.close(self._fd)

    @contextmanager
    def locked(self, deadline: float | None = None) -> Iterator[Record]:
        """The record, held exclusively; written back when the block ends without an error."""
        until = min(math.inf if deadline is None else deadline, time.monotonic() + LOCK_WAIT_S)
        if not self._threads.acquire(timeout=max(until - time.monotonic(), 0.0)):
            raise self._stuck()
        try:
            if self._closed:
                raise LimitStateError(f"endpoint {self.limit.name!r}: {self.path} is closed")
            self._flock(until)
            try:
                record = self._read()
                yield record
                self._write(record)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._threads.release()

    def register(self, now: float) -> None:
        """Join the endpoint's users; declare our limits if we are the only one."""
        with self.locked() as record:
            try:
                fcntl.flock(self._users, fcntl.LOCK_EX | fcntl.LOCK_NB)
                alone = True
            except BlockingIOError:
                alone = False
            mine = self.limit.declared()
            if alone or record.declared is None:
                record.declared, record.levels = mine, Levels.full(self.limit, now)
            elif record.declared != mine:
                raise LimitConflict(
                    f"endpoint {self.limit.name!r}: other processes on this node declared "
                    f"{record.declared}, this one {mine}; one limit per endpoint per node "
                    f"(state {self.path})"
                )
            # under the record's lock: no other process is between the two
            fcntl.flock(self._users, fcntl.LOCK_SH)

    def _flock(self, until: float) -> None:
        pause = 0.0005
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() + pause > until:
                    raise self._stuck() from None
                time.sleep(pause)
                pause = min(pause * 2, 0.005)

    def _stuck(self) -> LimitStateError:
        return LimitStateError(
            f"endpoint {self.limit.name!r}: the lock of {self.path} was held past "
            f"{LOCK_WAIT_S:g} s or the deadline (a stopped process holds it?)"
        )

    def _read(self) -> Record:
        raw = os.pread(self._fd, RECORD_BYTES, 0)
        if not raw.strip():
            return Record(None, None)
        try:
            document = json.loads(raw)
            return Record(document["declared"], Levels.of(document["levels"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise LimitStateError(
                f"endpoint {self.limit.name!r}: {self.path} does not hold a limits record "
                f"({type(exc).__name__}: {exc}); remove it once no process uses the endpoint"
            ) from exc

    def _write(self, record: Record) -> None:
        if record.levels is None:
            return
        document = {"declared": record.declared, "levels": record.levels.as_record()}
        payload = json.dumps(document).encode()
        if len(payload) > RECORD_BYTES:
            raise LimitStateError(f"{self.path}: a record of {len(payload)} bytes does not fit")
        os.pwrite(self._fd, payload.ljust(RECORD_BYTES, b" "), 0)


_open_ledgers: weakref.WeakSet[Ledger] = weakref.WeakSet()


def _forget_after_fork() -> None:
    """A forked child drops its copies of the parent's files: it is no user of the endpoint (the
    parent's locks stay the parent's) and must open its own."""
    for ledger in list(_open_ledgers):
        ledger._forget()


os.register_at_fork(after_in_child=_forget_after_fork)
