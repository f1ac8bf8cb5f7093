"""What /proc says about an engine's session: its processes, their memory, and whether the socket
listening on the engine's port is one of theirs.

Why the last: the port is chosen free a moment before the engine binds it, so another local process
(another rank's engine, or anyone's server) could be listening there instead and answer the
readiness probe; rewards must come from the process this scorer started, so readiness also asks
the kernel who owns the listening socket. Stdlib only, Linux only (as the keeper's PDEATHSIG).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


def session_members(session: int) -> Iterator[int]:
    """Pids of the live processes whose session id is `session` (the keeper's pid)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except OSError:
            continue  # ended while read
        if len(fields) > 3 and fields[0] != "Z" and int(fields[3]) == session:
            yield int(entry)  # fields after the name: state, ppid, pgrp, session


def session_rss_bytes(session: int | None) -> int:
    """The resident memory of every process in the session (keeper, engine, its workers)."""
    if session is None:
        return 0
    total, page = 0, os.sysconf("SC_PAGE_SIZE")
    for pid in session_members(session):
        try:
            with open(f"/proc/{pid}/statm") as statm:
                total += int(statm.read().split()[1]) * page
        except OSError:
            continue  # ended while read: it holds nothing now
    return total


def listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on `port` (IPv4 and IPv6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                next(lines, None)
                for line in lines:
                    fields = line.split()
                    local, state, inode = fields[1], fields[3], fields[9]
                    if state == LISTEN and int(local.rpartition(":")[2], 16) == port:
                        found.add(inode)
        except OSError:
            continue  # no IPv6 here
    return found


def listener_in_session(port: int, session: int) -> bool:
    """True when a process of `session` holds the socket listening on `port`."""
    inodes = {f"socket:[{inode}]" for inode in listening_inodes(port)}
    if not inodes:
        return False
    for pid in session_members(session):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return True
            except OSError:
                continue
    return False
