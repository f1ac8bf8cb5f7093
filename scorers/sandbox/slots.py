"""The unnamed host uid a root scorer's sandbox runs as, one per running sandbox on the machine.

A uid is held by binding an abstract unix socket named after it: no file is left anywhere, the
kernel releases it when the holder dies, and every scorer process of the machine (every rank's
child) sees the same names, so two sandboxes never share a uid (nor its RLIMIT_NPROC count). A
uid that names a user in the passwd database is never taken.
"""

from __future__ import annotations

import contextlib
import errno
import pwd
import socket
from collections.abc import Iterator

from scorers.sandbox.results import SandboxUnavailable

FIRST_UID = 61000
SLOTS = 1024


def _named(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


@contextlib.contextmanager
def host_uid() -> Iterator[int]:
    """Hold a free unnamed uid of FIRST_UID..FIRST_UID+SLOTS-1 for the `with` block."""
    for uid in range(FIRST_UID, FIRST_UID + SLOTS):
        if _named(uid):
            continue
        holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            holder.bind(f"\0managed-scorers-sandbox-uid-{uid}")
        except OSError as error:
            holder.close()
            if error.errno == errno.EADDRINUSE:
                continue
            raise SandboxUnavailable(f"cannot hold sandbox uid {uid}: {error}") from error
        try:
            yield uid
        finally:
            holder.close()
        return
    raise SandboxUnavailable(f"all {SLOTS} sandbox uids from {FIRST_UID} are in use")
