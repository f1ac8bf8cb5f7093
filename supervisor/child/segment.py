"""The trainer's half of the shared-memory data plane: one sealed memfd per child, reused per call.

Why a memfd and not a named `/dev/shm` segment: it has no name, so nothing can leak
there. The kernel frees it when the last descriptor or mapping goes, whichever side
crashes. It is sealed against shrinking (F_SEAL_SHRINK), so the child's mapping can
never be cut short under it and a read never raises SIGBUS. Its capacity is fixed at
creation (address space); pages exist only where extents are in use, and free extents
beyond a small warm reserve give their pages back (hole punching), so one large
request does not pin its memory for the child's life. The memfd's mode is 0400: a
process of the same (non-root) user cannot reopen it writable through /proc.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import math
import mmap
import os
import threading
import weakref
from collections.abc import Callable, Iterator

import numpy as np
import numpy.typing as npt

from child_runtime.protocol.shared_segment import SEGMENT_NAME, SharedSegmentUnavailable, available
from child_runtime.protocol.wire import ALIGN, aligned

# Free pages kept for reuse: a steady stream of requests up to this size (8 x 512x512 RGB
# is 6.3 MB) never faults fresh pages in; anything freed beyond it is given back at once.
WARM_RESERVE_BYTES = 8 << 20
_PAGE = mmap.PAGESIZE

_LIVE_PARENT_SEGMENTS: weakref.WeakSet[ParentSegment] = weakref.WeakSet()


def _drop_segments_after_fork() -> None:
    """A process forked from the trainer (a DataLoader worker) must not pin the segments' memory.

    Arena arrays the forked process inherited keep their mapping until they go: the
    mapping cannot be unmapped under live numpy arrays.
    """
    for segment in list(_LIVE_PARENT_SEGMENTS):
        segment._forget_after_fork()


os.register_at_fork(after_in_child=_drop_segments_after_fork)


class _ArenaExtent:
    __slots__ = ("size", "pins", "released")

    def __init__(self, size: int) -> None:
        self.size = size
        self.pins = 0  # requests in flight that send arrays from it in place
        self.released = False  # its arena closed while pinned: freed at the last unpin


def _insert(intervals: list[tuple[int, int]], start: int, end: int) -> None:
    """Add [start, end) to sorted, disjoint, coalesced intervals."""
    kept = [(s, e) for s, e in intervals if e < start or s > end]
    for s, e in intervals:
        if not (e < start or s > end):
            start, end = min(start, s), max(end, e)
    kept.append((start, end))
    kept.sort()
    intervals[:] = kept


def _remove(intervals: list[tuple[int, int]], start: int, end: int) -> None:
    """Take [start, end) out of sorted, disjoint intervals."""
    out: list[tuple[int, int]] = []
    for s, e in intervals:
        if e <= start or s >= end:
            out.append((s, e))
            continue
        if s < start:
            out.append((s, start))
        if e > end:
            out.append((end, e))
    intervals[:] = out


def _overlaps(intervals: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    """The parts of [start, end) covered by `intervals`, in order."""
    return [(max(s, start), min(e, end)) for s, e in intervals if s < end and e > start]


class ParentSegment:
    """The parent's side: a fixed-capacity sealed memfd, mapped once, carved by a small allocator.

    Extents hold either one request's copied arrays, freed when its answer is in, or
    arena arrays (`SharedArena`) the trainer fills in place and sends without a copy; an
    arena extent a request is sending stays allocated until the answer, even if its arena
    closes meanwhile. Only arrays inside live arena extents are sent in place; anything
    else is copied. Pages behind an extent are reserved with fallocate when it is handed
    out (a machine short of memory fails there, never with SIGBUS mid-copy). The child
    gets `child_fd`: a read-only descriptor of the same memfd. Thread-safe.
    """

    def __init__(self, capacity: int, warm_reserve: int = WARM_RESERVE_BYTES) -> None:
        if not available():
            raise SharedSegmentUnavailable("memfd_create or file sealing is not available here")
        self.capacity = capacity // ALIGN * ALIGN  # every extent ends inside the limit
        if self.capacity < _PAGE:
            raise SharedSegmentUnavailable(
                f"a {capacity}-byte segment is too small to be worth mapping"
            )
        self.warm_reserve = warm_reserve
        self._lock = threading.Lock()
        self.fd = os.memfd_create(SEGMENT_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        self.child_fd = -1
        try:
            # memfds start 0777: no same-user reopen for writing via /proc
            os.fchmod(self.fd, 0o400)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
            self.child_fd = os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)
            os.ftruncate(self.fd, self.capacity)
            self._map: mmap.mmap | None = mmap.mmap(self.fd, self.capacity)
        except (OSError, ValueError) as exc:
            _close_fds(self.fd, self.child_fd)
            raise SharedSegmentUnavailable(
                f"cannot create a {self.capacity}-byte shared segment: {exc}"
            ) from exc
        self._bytes = np.frombuffer(self._map, np.uint8)
        self._base = self._bytes.ctypes.data
        # (offset, size), sorted, coalesced
        self._free: list[tuple[int, int]] = [(0, self.capacity)]
        self._backed: list[tuple[int, int]] = []  # [start, end) ranges whose pages exist
        self._arena: dict[int, _ArenaExtent] = {}
        self._arena_starts: list[int] = []  # sorted keys of _arena
        self.copied_bytes = 0  # what requests copied in, and what they sent from arenas in place
        self.in_place_bytes = 0
        self.returned_bytes = 0  # pages given back to the kernel
        # an owner that forgot close()
        self._fd_closer = weakref.finalize(self, _close_fds, self.fd, self.child_fd)
        _LIVE_PARENT_SEGMENTS.add(self)

    @property
    def free_bytes(self) -> int:
        with self._lock:
            return sum(size for _, size in self._free)

    @property
    def backed_bytes(self) -> int:
        """Bytes whose pages exist (in use, or kept warm for reuse)."""
        with self._lock:
            return sum(end - start for start, end in self._backed)

    def allocate(self, nbytes: int, arena: bool = False) -> int:
        """Offset of a fresh 64-byte-aligned extent. MemoryError when no extent is large enough,
        OSError when its pages cannot be had, ValueError once closed.

        Arena extents come from the bottom of the segment, a request's copies from the top:
        an arena array wrongly used after its arena closed is then overwritten by later arena
        allocations only, never by the copies of the request that sends it.
        """
        need = max(aligned(nbytes), ALIGN)
        with self._lock:
            if self.fd < 0:
                raise ValueError("shared segment is closed")
            order = range(len(self._free)) if arena else range(len(self._free) - 1, -1, -1)
            for index in order:
                start, size = self._free[index]
                if size >= need:
                    break
            else:
                raise MemoryError(
                    f"no free extent of {need} bytes in the {self.capacity}-byte shared segment"
                )
            offset = start if arena else start + size - need
            rest = [(start + need, size - need)] if arena else [(start, size - need)]
            self._free[index : index + 1] = rest if size > need else []
            try:
                self._reserve_locked(offset, offset + need)
            except BaseException:  # also Ctrl-C: the extent goes back, never lost
                self._release_locked(offset, need)
                raise
            if arena:
                self._arena[offset] = _ArenaExtent(need)
                bisect.insort(self._arena_starts, offset)
        return offset

    def _reserve_locked(self, start: int, end: int) -> None:
        """fallocate the parts of [start, end) that have no pages yet (page-rounded)."""
        low, high = start // _PAGE * _PAGE, min(self.capacity, -(-end // _PAGE) * _PAGE)
        covered = _overlaps(self._backed, low, high)
        cursor = low
        for s, e in covered + [(high, high)]:
            if s > cursor:
                os.posix_fallocate(self.fd, cursor, s - cursor)
                _insert(self._backed, cursor, s)
            cursor = max(cursor, e)

    def release(self, offset: int, nbytes: int) -> None:
        """Free a request's extent."""
        with self._lock:
            if self.fd >= 0:
                self._release_locked(offset, max(aligned(nbytes), ALIGN))

    def release_arena(self, offset: int) -> None:
        """Free an arena extent, or mark it to be freed when the last request sending it is
        answered."""
        with self._lock:
            extent = self._arena.get(offset)
            if extent is None or self.fd < 0:
                return
            if extent.pins:
                extent.released = True
            else:
                self._drop_arena_locked(offset, extent)

    def _drop_arena_locked(self, offset: int, extent: _ArenaExtent) -> None:
        del self._arena[offset]
        self._arena_starts.remove(offset)
        self._release_locked(offset, extent.size)

    def _release_locked(self, offset: int, size: int) -> None:
        self._free.append((offset, size))
        self._free.sort()
        merged: list[tuple[int, int]] = []
        for start, length in self._free:
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((start, length))
        self._free = merged
        self._trim_locked()

    def _trim_locked(self) -> None:
        """Give back the pages of free extents beyond the warm reserve, keeping the topmost warm
        (a request's copies are carved from the top). Only whole pages inside a free extent go."""
        budget = self.warm_reserve
        for start, size in reversed(self._free):
            for s, e in reversed(_overlaps(self._backed, start, start + size)):
                keep = min(budget, e - s)
                budget -= keep
                low, high = -(-s // _PAGE) * _PAGE, (e - keep) // _PAGE * _PAGE
                if high > low and self._map is not None:
                    # punches a hole: pages freed
                    self._map.madvise(mmap.MADV_REMOVE, low, high - low)
                    _remove(self._backed, low, high)
                    self.returned_bytes += high - low

    def array(self, offset: int, shape: tuple[int, ...], dtype: npt.DTypeLike) -> np.ndarray:
        """A writable array over an allocated extent."""
        dtype = np.dtype(dtype)
        count = math.prod(shape)
        return self._bytes[offset : offset + count * dtype.itemsize].view(dtype).reshape(shape)

    def _arena_extent_of(self, arr: np.ndarray) -> tuple[int, int] | None:
        """(offset of arr, start of its live arena extent), under the lock; None unless arr lies
        wholly inside a live arena extent, contiguous and aligned for the wire."""
        if self.fd < 0 or not arr.flags.c_contiguous:
            return None
        offset = arr.ctypes.data - self._base
        if offset < 0 or offset + arr.nbytes > self.capacity or offset % ALIGN:
            return None
        index = bisect.bisect_right(self._arena_starts, offset) - 1
        if index < 0:
            return None
        start = self._arena_starts[index]
        extent = self._arena[start]
        if extent.released or offset + arr.nbytes > start + extent.size:
            return None
        return offset, start

    def locate(self, arr: np.ndarray) -> int | None:
        """The offset of `arr` if it can be sent in place (it lies in a live arena extent)."""
        with self._lock:
            found = self._arena_extent_of(arr)
        return None if found is None else found[0]

    @contextlib.contextmanager
    def placement(self) -> Iterator[Callable[[np.ndarray], int]]:
        """`place(arr) -> offset` for one request: arena arrays are sent in place and their extents
        pinned; others are copied into fresh extents. All are let go when the block ends (after
        the answer)."""
        copies: list[tuple[int, int]] = []
        pinned: list[int] = []

        def place(arr: np.ndarray) -> int:
            with self._lock:
                found = self._arena_extent_of(arr)
                if found is not None:
                    self._arena[found[1]].pins += 1
                    pinned.append(found[1])
                    self.in_place_bytes += arr.nbytes
                    return found[0]
            offset = self.allocate(arr.nbytes)
            copies.append((offset, arr.nbytes))
            self._bytes[offset : offset + arr.nbytes] = arr.reshape(-1).view(np.uint8)
            self.copied_bytes += arr.nbytes
            return offset

        try:
            yield place
        finally:
            for offset, nbytes in copies:
                self.release(offset, nbytes)
            with self._lock:
                for start in pinned:
                    extent = self._arena.get(start)
                    if extent is not None:
                        extent.pins -= 1
                        if extent.released and not extent.pins and self.fd >= 0:
                            self._drop_arena_locked(start, extent)

    def close(self) -> None:
        """Idempotent; arrays still referenced keep the mapping alive until they go."""
        with self._lock:
            # first: no later call can act on a recycled descriptor number
            self.fd = self.child_fd = -1
            self._free, self._backed, self._arena, self._arena_starts = [], [], {}, []
            old, self._map = self._map, None
            self._bytes = np.zeros(0, np.uint8)
            _close_map(old)
            self._fd_closer()

    def _forget_after_fork(self) -> None:
        """In a forked child: the lock may have been held by a thread that does not exist here."""
        self._lock = threading.Lock()
        self.close()


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


class SharedArena:
    """Arrays the trainer fills in place inside the shared segment, then scores without a copy.

    Valid until `close()` (or the end of the `with` block). Closing while a request is
    sending them is safe: their extent is freed when that answer is in. When the segment
    is full or gone (a restarted child, a forked process), `empty()` returns ordinary
    memory instead (`heap_fallbacks` counts them): those arrays are copied when scored.
    """

    def __init__(self, segment: ParentSegment) -> None:
        self._segment = segment
        self._taken: list[int] = []
        self._lock = threading.Lock()
        self.heap_fallbacks = 0

    def empty(self, shape: tuple[int, ...] | int, dtype: npt.DTypeLike = np.uint8) -> np.ndarray:
        """An uninitialised array, in the segment when it has room."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        try:
            offset = self._segment.allocate(nbytes, arena=True)
        except (MemoryError, OSError, ValueError):
            with self._lock:
                self.heap_fallbacks += 1
            return np.empty(shape, dtype)
        with self._lock:
            self._taken.append(offset)
        return self._segment.array(offset, shape, dtype)

    def close(self) -> None:
        with self._lock:
            taken, self._taken = self._taken, []
        for offset in taken:
            self._segment.release_arena(offset)

    def __enter__(self) -> SharedArena:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
