"""A cgroup per sandbox, where this machine lets the scorer make one: the kernel's own bound on all
of the sandbox's memory together (its processes' and its tmpfs files'), with no polling gap.

Where (`find`, read at each sandbox's start):
- `$MANAGED_SCORERS_CGROUP` names a cgroup v2 folder delegated to the scorer (systemd's
  `Delegate=yes`, a container's own cgroup): it must offer the `memory` controller, hold no
  process, and be writable. One that cannot serve refuses the boot (`SandboxUnavailable`, naming
  why), never a quiet run without it. `off` switches cgroups off.
- Else, the scorer's own cgroup of a v1 `memory` hierarchy, where it may make folders in it (root
  on a v1 or hybrid machine, as here).
- Else none, and `find` says why. The sandbox's other bounds hold either way (rlimits, the
  launcher's resident-memory watch, the PID namespace): the cgroup is a further layer.
A sandbox's cgroup is made before bwrap starts (a shell writes its own pid into it, then becomes
bwrap: every process of the sandbox is born inside) and removed once the sandbox is gone.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from scorers.sandbox.results import SandboxStuck, SandboxUnavailable

ENV = "MANAGED_SCORERS_CGROUP"
PREFIX = "managed-sandbox-"
REMOVE_S = 2.0  # a sandbox's cgroup empties within this once its processes are killed
_COUNTER = itertools.count()
_SWEPT: set[Path] = set()


@dataclass(frozen=True)
class Place:
    """Where sandboxes' cgroups are made: the folder, and its cgroup version (1 or 2)."""

    version: int
    parent: Path

    def describe(self) -> str:
        return f"cgroup v{self.version} memory at {self.parent}"


def _mounts() -> list[tuple[str, str, str, str]]:
    """(root, mount point, fs type, super options) of every mount this process sees."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        head, _, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if len(fields) >= 5 and len(rest) >= 3:
            found.append((fields[3], fields[4], rest[0], rest[2]))
    return found


@functools.cache
def _own_v1_memory() -> Path | None:
    """This process's cgroup folder in a v1 memory hierarchy, if it has one (read once: every
    sandbox's start asks)."""
    relative = None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            relative = path
    for root, point, kind, options in _mounts():
        if relative is not None and kind == "cgroup" and "memory" in options.split(","):
            inside = (
                relative[len(root) :] if relative.startswith(root) and root != "/" else relative
            )
            return Path(point) / inside.lstrip("/")
    return None


@functools.cache
def _delegated(folder: Path) -> Place:
    """The configured cgroup v2 folder, ready for sandboxes (memory on for its children), or
    SandboxUnavailable naming what is wrong with it (a folder that serves is set up once)."""
    controllers = folder / "cgroup.controllers"
    if not controllers.is_file():
        raise SandboxUnavailable(
            f"{ENV}={folder} is not a cgroup v2 folder (no {controllers.name})"
        )
    offered = controllers.read_text().split()
    if "memory" not in offered:
        raise SandboxUnavailable(
            f"{ENV}={folder} does not offer the memory controller (it offers {offered}): delegate "
            "one that does, or set it to 'off'"
        )
    wanted = " ".join(f"+{name}" for name in ("memory", "pids") if name in offered)
    try:
        (folder / "cgroup.subtree_control").write_text(wanted)
    except OSError as error:  # EBUSY: it holds processes; EACCES: not delegated to this uid
        raise SandboxUnavailable(
            f"{ENV}={folder}: cannot turn on {wanted} for its children ({error}): it must hold no "
            "process and be writable by the scorer"
        ) from error
    return Place(2, folder)


def find() -> tuple[Place | None, str]:
    """Where this process makes sandboxes' cgroups, and how that was decided (or why none)."""
    configured = os.environ.get(ENV, "")
    if configured == "off":
        return None, f"switched off ({ENV}=off)"
    if configured:
        place = _delegated(Path(configured))
        return place, f"{place.describe()} ({ENV})"
    own = _own_v1_memory()
    if own is not None and os.access(own, os.W_OK | os.X_OK):
        place = Place(1, own)
        _sweep(place)
        return place, f"{place.describe()} (this process's own, writable)"
    return None, (
        f"none: no {ENV} names a delegated cgroup v2 folder, and this process's v1 memory "
        f"cgroup is {'absent' if own is None else f'not writable ({own})'}"
    )


def _sweep(place: Place) -> None:
    """Remove the empty cgroups that dead scorers' sandboxes left (once per folder a process)."""
    if place.parent in _SWEPT:
        return
    _SWEPT.add(place.parent)
    for folder in place.parent.glob(PREFIX + "*"):
        owner = folder.name[len(PREFIX) :].split("-")[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            with contextlib.suppress(OSError):  # not empty yet: its processes are still dying
                folder.rmdir()


class SandboxCgroup:
    """One sandbox's cgroup: made with its memory limit, joined by the sandbox's first process
    (`procs`), read for OOM kills, removed once its processes are gone."""

    def __init__(self, place: Place, memory_bytes: int) -> None:
        self.place = place
        self.folder = place.parent / f"{PREFIX}{os.getpid()}-{next(_COUNTER)}"
        self.folder.mkdir()
        self.memory_bytes: int | None = None  # unlimited, as made
        try:
            self.limit(memory_bytes)
        except BaseException:
            self.folder.rmdir()
            raise

    @property
    def procs(self) -> str:
        return str(self.folder / "cgroup.procs")

    def limit(self, memory_bytes: int) -> None:
        """All of the sandbox's memory together at most `memory_bytes`, swap included."""
        if memory_bytes == self.memory_bytes:
            return
        if self.place.version == 2:
            self._write("memory.max", memory_bytes)
            self._write("memory.swap.max", 0, optional=True)
        else:  # v1: memory+swap may never be below memory alone, so the order depends on the way
            order = ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]
            lower = self.memory_bytes is None or memory_bytes < self.memory_bytes
            for name in order if lower else order[::-1]:
                self._write(name, memory_bytes, optional=name.startswith("memory.memsw"))
        self.memory_bytes = memory_bytes

    def _write(self, name: str, value: int, optional: bool = False) -> None:
        path = self.folder / name
        if optional and not path.exists():
            return
        path.write_text(str(value))

    def oom_killed(self) -> bool:
        """Whether the kernel killed any of its processes for the cgroup's memory limit."""
        name = "memory.events" if self.place.version == 2 else "memory.oom_control"
        for line in (self.folder / name).read_text().splitlines():
            key, _, count = line.partition(" ")
            if key == "oom_kill":
                return int(count) > 0
        return False

    def peak_bytes(self) -> int:
        """The most memory it held at once (0 where the kernel does not say: v2 before 5.19)."""
        path = self.folder / (
            "memory.peak" if self.place.version == 2 else "memory.max_usage_in_bytes"
        )
        return int(path.read_text()) if path.exists() else 0

    def remove(self) -> None:
        """Kill what is left in it and remove it; SandboxStuck if it will not empty."""
        deadline = time.monotonic() + REMOVE_S
        while True:
            try:
                self.folder.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as error:  # EBUSY: a process is still in it
                if time.monotonic() >= deadline:
                    raise SandboxStuck(
                        f"the sandbox's cgroup {self.folder} did not empty within {REMOVE_S} s "
                        f"of its sandbox's end ({error})"
                    ) from error
            self._kill_all()
            time.sleep(0.01)

    def _kill_all(self) -> None:
        for pid in (self.folder / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
