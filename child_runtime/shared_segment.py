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
import weakref

from child_runtime.wire import WireError

SEGMENT_NAME = "managed-scorers-data-plane"
_PAGE = mmap.PAGESIZE


class SharedSegmentUnavailable(OSError):
    """This platform or descriptor cannot carry the data plane; requests travel in-band."""


def available() -> bool:
    return hasattr(os, "memfd_create") and hasattr(fcntl, "F_ADD_SEALS")


class ParentSegment:
    """The parent's writable mapping. Grows to the next power of two, never beyond `max_bytes`."""

    def __init__(self, max_bytes: int) -> None:
        if not available():
            raise SharedSegmentUnavailable("memfd_create or file sealing is not available here")
        self.max_bytes = max_bytes
        self.fd = os.memfd_create(SEGMENT_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        except OSError:
            os.close(self.fd)
            raise
        self.size = 0
        self._map: mmap.mmap | None = None
        self._fd_closer = weakref.finalize(self, os.close, self.fd)  # an owner that forgot close()

    def view(self, nbytes: int) -> memoryview:
        """A writable view of at least `nbytes`; grows the segment first when it is smaller."""
        if nbytes > self.max_bytes:
            raise ValueError(f"{nbytes} bytes of arrays exceed the shared segment cap of {self.max_bytes}")
        if self.fd < 0:
            raise ValueError("shared segment is closed")
        if nbytes > self.size or self._map is None:
            size = min(self.max_bytes, max(_PAGE, 1 << max(nbytes - 1, 1).bit_length()))
            size = max(size, self.size, nbytes)
            os.ftruncate(self.fd, size)
            old, self._map, self.size = self._map, mmap.mmap(self.fd, size), size
            if old is not None:
                try:
                    old.close()
                except BufferError:
                    pass  # a view is still exported: the mapping goes when that view does
        return memoryview(self._map)

    def close(self) -> None:
        """Idempotent; safe while another thread still writes (its view keeps the mapping alive)."""
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # a view is still exported: the mapping goes when that view does
            self._map = None
        self._fd_closer()
        self.fd = -1


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
            self._map = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
            self._view = memoryview(self._map)
        return self._view

    def close(self) -> None:
        self._view = None
        self._map = None
        os.close(self.fd)
