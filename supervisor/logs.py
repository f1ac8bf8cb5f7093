"""Per-child log files: created 0600 in a directory the user owns; tails for error messages."""
from __future__ import annotations

import os
import secrets
import tempfile
import time
from pathlib import Path

TAIL_BYTES = 4096


def default_log_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"managed-scorers-{os.getuid()}"


def open_child_log(log_dir: Path | None, name: str, rank: int | None) -> tuple[int, Path]:
    """Create a fresh log file (O_EXCL, 0600) and return its fd and path."""
    directory = Path(log_dir) if log_dir is not None else default_log_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if directory.stat().st_uid != os.getuid():
        raise PermissionError(f"log dir {directory} is not owned by uid {os.getuid()}")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = directory / f"{name}-rank{rank if rank is not None else 0}-{stamp}-{secrets.token_hex(3)}.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
    return fd, path


def read_tail(path: Path | None, limit: int = TAIL_BYTES) -> str:
    """The last `limit` bytes of a log, decoded leniently; empty when unreadable."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            return handle.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"<log unreadable: {exc}>"
