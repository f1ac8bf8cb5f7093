"""The child's half of the shared-memory data plane: a read-only mapping of the parent's memfd.

The parent (`supervisor.child.segment.ParentSegment`) creates the memfd, seals it against
shrinking and re-sealing, and hands the child a read-only descriptor. The child checks
the seal (so a read can never SIGBUS) and maps it once, read-only: such a mapping
cannot be made writable. The memfd's mode is 0400, so a scorer that is not root
cannot reopen its descriptor writable through /proc either. Stdlib + numpy only.
"""

from __future__ import annotations

import fcntl
import mmap
import os

from child_runtime.protocol.wire import WireError

SEGMENT_NAME = "managed-scorers-data-plane"


class SharedSegmentUnavailable(OSError):
    """This platform or descriptor cannot carry the data plane; requests travel in-band."""


def available() -> bool:
    return hasattr(os, "memfd_create") and hasattr(fcntl, "F_ADD_SEALS")


class ChildSegment:
    """The child's read-only mapping of the parent's segment, mapped once: its size never
    changes."""

    def __init__(self, fd: int, max_bytes: int) -> None:
        try:
            try:
                seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            except OSError as exc:
                raise SharedSegmentUnavailable(f"fd {fd} is not a sealable memfd: {exc}") from exc
            if not seals & fcntl.F_SEAL_SHRINK:
                raise SharedSegmentUnavailable(
                    f"fd {fd} is not sealed against shrinking; a read could SIGBUS"
                )
            size = os.fstat(fd).st_size
            try:
                self._map: mmap.mmap | None = mmap.mmap(
                    fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ
                )
            # e.g. ENOMEM, an address-space limit, an empty file
            except (OSError, ValueError) as exc:
                raise SharedSegmentUnavailable(
                    f"cannot map the {size}-byte shared segment: {exc}"
                ) from exc
        finally:
            os.close(fd)  # the mapping keeps its own (read-only) duplicate
        self.max_bytes = max_bytes
        self._view: memoryview | None = memoryview(self._map)

    def view(self, nbytes: int) -> memoryview:
        """A read-only view of the segment, which must hold `nbytes`; WireError naming why not."""
        if self._view is None:
            raise WireError("the shared segment is closed")
        if nbytes > self.max_bytes:
            raise WireError(
                f"shared frame spans {nbytes} bytes (limit max_request_bytes={self.max_bytes})"
            )
        if nbytes > len(self._view):
            raise WireError(f"shared frame spans {nbytes} bytes; the segment has {len(self._view)}")
        return self._view

    def close(self) -> None:
        """The mapping goes once no array a scorer kept still points into it."""
        self._view = None
        self._map = None
