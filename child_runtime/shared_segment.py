"""The shared-memory data plane: one sealed memfd per child, created by the parent, reused per call.

Why a memfd and not a named `/dev/shm` segment: it has no name, so nothing can leak
there. The kernel frees it when the last descriptor or mapping goes, whichever side
crashes. The parent seals it against shrinking (F_SEAL_SHRINK): the child's
mapping can never be cut short under it, so a read never raises SIGBUS. The segment
grows, up to a cap, when a request needs more; the child remaps read-only on demand.
Arrays decoded from it are read-only views that are valid until the next request.

Stdlib + numpy only: every scorer env imports this module from the service root.
"""
from __future__ import annotations

import fcntl
import mmap
import os
import threading
import weakref

from child_runtime.wire import WireError

SEGMENT_NAME = "managed-scorers-data-plane"
_PAGE = mmap.PAGESIZE


class SharedSegmentUnavailable(OSError):
    """This platform or descriptor cannot carry the data plane; requests travel in-band."""


def available() -> bool:
    return hasattr(os, "memfd_create") and hasattr(fcntl, "F_ADD_SEALS")


_LIVE_PARENT_SEGMENTS: "weakref.WeakSet[ParentSegment]" = weakref.WeakSet()


def _drop_segments_after_fork() -> None:
    """A process forked from the trainer (a DataLoader worker) must not pin the segments' memory."""
    for segment in list(_LIVE_PARENT_SEGMENTS):
        segment.close()


os.register_at_fork(after_in_child=_drop_segments_after_fork)


class ParentSegment:
    """The parent's writable mapping. Grows to the next power of two, never beyond `max_bytes`.

    The child gets `child_fd`: a read-only descriptor of the same memfd, sealed against
    shrinking and against new seals, so it can neither grow, shrink nor re-seal it.
    Thread-safe: growth and close() never interleave.
    """

    def __init__(self, max_bytes: int) -> None:
        if not available():
            raise SharedSegmentUnavailable("memfd_create or file sealing is not available here")
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self.fd = os.memfd_create(SEGMENT_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        self.child_fd = -1
        try:
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
            self.child_fd = os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            os.close(self.fd)
            raise
        self.size = 0
        self._map: mmap.mmap | None = None
        self._fd_closer = weakref.finalize(self, _close_fds, self.fd, self.child_fd)  # an owner that forgot close()
        _LIVE_PARENT_SEGMENTS.add(self)

    def view(self, nbytes: int) -> memoryview:
        """A writable view of at least `nbytes`; grows the segment first when it is smaller.

        OSError when the memory cannot be had: growth reserves the pages (fallocate), so a
        short machine fails here, never with SIGBUS while the arrays are copied in.
        """
        if nbytes > self.max_bytes:
            raise ValueError(f"{nbytes} bytes of arrays exceed the shared segment cap of {self.max_bytes}")
        with self._lock:
            if self.fd < 0:
                raise ValueError("shared segment is closed")
            if nbytes > self.size or self._map is None:
                size = min(self.max_bytes, max(_PAGE, 1 << max(nbytes - 1, 1).bit_length()))
                size = max(size, self.size, nbytes)
                os.ftruncate(self.fd, size)
                if size > self.size:
                    os.posix_fallocate(self.fd, self.size, size - self.size)
                new_map = mmap.mmap(self.fd, size)
                old, self._map, self.size = self._map, new_map, size
                _close_map(old)
            return memoryview(self._map)

    def close(self) -> None:
        """Idempotent; safe while another thread still writes (its view keeps the mapping alive)."""
        with self._lock:
            self.fd = self.child_fd = -1  # first: no later call can act on a recycled descriptor number
            old, self._map = self._map, None
            _close_map(old)
            self._fd_closer()


def _close_fds(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            os.close(fd)


def _close_map(mapping: mmap.mmap | None) -> None:
    if mapping is None:
        return
    try:
        mapping.close()
    except BufferError:
        pass  # a view is still exported: the mapping goes when that view does


class ChildSegment:
    """The child's read-only mapping of the parent's segment, remapped when it has grown."""

    def __init__(self, fd: int, max_bytes: int) -> None:
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError as exc:
            raise SharedSegmentUnavailable(f"fd {fd} is not a sealable memfd: {exc}") from exc
        if not seals & fcntl.F_SEAL_SHRINK:
            raise SharedSegmentUnavailable(f"fd {fd} is not sealed against shrinking; a read could SIGBUS")
        os.set_inheritable(fd, False)  # the scorer's own subprocesses never get it
        self.fd = fd
        self.max_bytes = max_bytes
        self._map: mmap.mmap | None = None
        self._view: memoryview | None = None

    def view(self, nbytes: int) -> memoryview:
        """A read-only view of at least `nbytes`, or WireError naming why not."""
        if nbytes > self.max_bytes:
            raise WireError(f"shared frame spans {nbytes} bytes (limit max_request_bytes={self.max_bytes})")
        if self._view is None or nbytes > len(self._view):
            size = os.fstat(self.fd).st_size
            if nbytes > size:
                raise WireError(f"shared frame spans {nbytes} bytes; the segment has {size}")
            if size == 0:
                return memoryview(b"")
            # The old mapping is dropped, not closed: a scorer may still hold views into it.
            try:
                self._map = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
            except OSError as exc:  # e.g. ENOMEM, an address-space limit
                raise SharedSegmentUnavailable(f"cannot map the {size}-byte shared segment: {exc}") from exc
            self._view = memoryview(self._map)
        return self._view

    def close(self) -> None:
        self._view = None
        self._map = None
        os.close(self.fd)
