"""Where the node's shared limits live: a private per-user directory, and an endpoint's files.

The directory is `$MANAGED_SCORERS_LIMITS_DIR` when set, else `$XDG_RUNTIME_DIR/managed-scorers/
limits` (a tmpfs of this user's, gone at reboot), else `~/.cache/managed-scorers/limits`. It must be
a directory this user owns with no access for group or others (0700): another local user can then
neither read, lower nor raise our limits. Every file in it is opened without following links, mode
0600. Its names carry the host name, so a home directory shared over NFS still keeps one limit per
node. Stdlib only.
"""

from __future__ import annotations

import hashlib
import os
import socket
import stat
from pathlib import Path

from scorers.limits.errors import LimitStateError

DIR_ENV = "MANAGED_SCORERS_LIMITS_DIR"


def _default() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "managed-scorers" / "limits"
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "managed-scorers" / "limits"


def private_dir(path: Path) -> Path:
    """`path`, made (0700) if missing; LimitStateError naming it unless it is a directory this user
    owns that no one else may enter."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.lstat()
    except OSError as exc:
        raise LimitStateError(f"endpoint limits: cannot make {path}: {exc}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise LimitStateError(f"endpoint limits: {path} is not a directory (a link or a file?)")
    if info.st_uid != os.getuid():
        raise LimitStateError(
            f"endpoint limits: {path} belongs to uid {info.st_uid}, not to this user "
            f"(uid {os.getuid()}): another user could set our limits"
        )
    if info.st_mode & 0o077:
        raise LimitStateError(
            f"endpoint limits: {path} has mode {stat.S_IMODE(info.st_mode):o}; it must be 700 "
            f"(other users could set our limits): chmod 700 {path}"
        )
    return path


def limits_dir() -> Path:
    explicit = os.environ.get(DIR_ENV)
    return private_dir(Path(explicit) if explicit else _default())


def endpoint_base(directory: Path, name: str) -> Path:
    """The prefix of one endpoint's files on this node: host name and a digest of the name."""
    digest = hashlib.sha256(name.encode()).hexdigest()[:24]
    return directory / f"{socket.gethostname()}-{digest}"


def open_private(path: Path) -> int:
    """An fd on `path` (created 0600, never through a link), read-write, closed on exec."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise LimitStateError(f"endpoint limits: cannot open {path}: {exc}") from exc
    if os.fstat(fd).st_uid != os.getuid():
        os.close(fd)
        raise LimitStateError(f"endpoint limits: {path} belongs to another user")
    return fd
