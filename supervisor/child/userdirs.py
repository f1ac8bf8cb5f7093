"""Private per-user directories: child logs, and the directory a child imports this project from.

Why not `/tmp/managed-scorers-<uid>`: any local user can create that name first and so
block every default launch. The default lives in this user's cache directory
($XDG_CACHE_HOME, else ~/.cache); when that cannot be had, in a fresh private
temporary directory, one per process.
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
import threading
from pathlib import Path

log = logging.getLogger(__name__)
_lock = threading.Lock()
_fallback: Path | None = None


def ensure_private(path: Path) -> Path:
    """Create `path` (mode 0700) if needed; OSError naming it unless it is a directory this user
    owns."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(f"{path} is not a directory (a symlink or file is in the way)")
    if info.st_uid != os.getuid():
        raise PermissionError(
            f"{path} belongs to uid {info.st_uid}, not to this user (uid {os.getuid()})"
        )
    return path


def state_dir() -> Path:
    """This user's private managed-scorers directory."""
    global _fallback
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    preferred = Path(cache) / "managed-scorers"
    try:
        path = ensure_private(preferred)
        if path.stat().st_mode & 0o022:
            raise PermissionError(f"{path} is writable by other users")
        return path
    except OSError as exc:
        with _lock:
            if _fallback is None:
                _fallback = Path(tempfile.mkdtemp(prefix=f"managed-scorers-{os.getuid()}-"))
                log.warning(
                    "cannot use %s (%s); using %s for this process", preferred, exc, _fallback
                )
            return _fallback
