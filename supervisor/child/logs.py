"""Per-child log files: created 0600 in a directory the user owns, pruned per scorer and rank."""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from supervisor.child.userdirs import ensure_private, state_dir

TAIL_BYTES = 4096


def default_log_dir() -> Path:
    return state_dir() / "logs"


def _owner_alive(name: str) -> bool:
    """Whether the trainer named in a log's file name (`...-pid<N>-...`) still runs: its children
    may."""
    for part in name.split("-"):
        if part.startswith("pid") and part[3:].isdigit():
            try:
                os.kill(int(part[3:]), 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True
    return False


def _prune(directory: Path, prefix: str, keep: int) -> None:
    """Remove the oldest `prefix*.log` files of trainers that are gone, so that at most `keep`
    remain. A log whose trainer still runs is never removed: its child may be writing it."""
    logs = []
    for entry in os.scandir(directory):
        if (
            entry.name.startswith(prefix)
            and entry.name.endswith(".log")
            and entry.is_file(follow_symlinks=False)
        ):
            try:
                logs.append((entry.stat(follow_symlinks=False).st_mtime, entry.name))
            except FileNotFoundError:
                # a concurrent launch (another term's child, another rank) pruned it between listing
                # and stat
                continue
    excess = len(logs) - keep
    for _, name in sorted(logs):
        if excess <= 0:
            return
        if _owner_alive(name):
            continue
        try:
            os.unlink(directory / name)
        except FileNotFoundError:
            pass  # another rank's launch pruned it first
        excess -= 1


def open_child_log(
    log_dir: Path | None, name: str, rank: int | None, keep: int
) -> tuple[int, Path]:
    """Create a fresh log file (O_EXCL, 0600) and return its fd and path. The oldest logs of the
    same scorer and rank whose trainer is gone are removed first, so at most `keep` remain where
    that can be done safely. OSError naming the path on failure."""
    directory = ensure_private(Path(log_dir) if log_dir is not None else default_log_dir())
    prefix = f"{name}-rank{rank if rank is not None else 0}-"
    _prune(directory, prefix, keep - 1)
    path = (
        directory
        / f"{prefix}pid{os.getpid()}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}.log"
    )
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
