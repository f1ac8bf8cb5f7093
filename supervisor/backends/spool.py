"""A private spool directory for payloads a service reads as files (the job backend's videos).

Why a file: a decoded video is hundreds of MiB (121x704x1280x3 uint8 is about 312 MiB); written
once with `numpy.save(..., allow_pickle=False)` it is streamed to the service from disk instead of
being held as a second copy in memory while the upload runs. The directory is this process's own
(0700, made by `tempfile.mkdtemp`), each file readable by this user only (0600, `mkstemp`), and a
file lives only for the `with` block that sends it. A process killed with -9 leaves its directory
behind: put `spool_dir` on storage the operator cleans (its name says the rank and the pid).
A payload that cannot be written (a full disk, a file-size limit, the directory gone) raises
`SpoolWriteFailed`, naming the file: a bare ENOSPC or EFBIG from `write` names nothing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO, NamedTuple

import numpy as np


class SpoolWriteFailed(OSError):
    """Writing a payload into the spool failed: the OSError's errno and text, and the file (or, when
    no file could be made, the directory) as its `filename`. The backend names the item."""


class Spooled(NamedTuple):
    """A payload in the spool: its file, open, and its path (for an error that names it)."""

    file: BinaryIO
    path: str


class Spool:
    """`with spool.payload(array) as spooled:` a private .npy file of `array`, open at its start,
    and removed when the block ends, whatever happens in it."""

    def __init__(self, root: str | None, rank: int) -> None:
        self.dir = tempfile.mkdtemp(
            prefix=f"managed-scorers-jobs-rank{rank}-pid{os.getpid()}-", dir=root
        )

    @contextmanager
    def payload(self, array: np.ndarray) -> Iterator[Spooled]:
        try:
            fd, path = tempfile.mkstemp(suffix=".npy", dir=self.dir)
        except OSError as exc:
            said = exc.strerror or str(exc)
            raise SpoolWriteFailed(
                exc.errno, f"no spool file could be made: {said}", self.dir
            ) from exc
        try:
            with os.fdopen(fd, "w+b") as file:
                try:
                    # a strided view is written in chunks, not copied whole
                    np.save(file, array, allow_pickle=False)
                    file.flush()
                except OSError as exc:
                    written = (
                        f"{os.fstat(file.fileno()).st_size} bytes on disk of a "
                        f"{array.nbytes}-byte array"
                    )
                    # its buffered rest fails again: the same error, said once
                    with contextlib.suppress(OSError):
                        file.close()
                    said = exc.strerror or str(exc)
                    raise SpoolWriteFailed(exc.errno, f"{said} ({written})", path) from exc
                file.seek(0)
                yield Spooled(file, path)
        finally:
            # close() may have removed the directory meanwhile
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def files(self) -> list[str]:
        """The payloads in the spool now (none between requests)."""
        return sorted(os.listdir(self.dir)) if os.path.isdir(self.dir) else []

    def close(self) -> None:
        """Remove the directory (and anything a failed unlink left in it)."""
        if os.path.isdir(self.dir):
            shutil.rmtree(self.dir)
