"""`probe`: can this machine sandbox code with this python? Run at boot; raises, never degrades."""

from __future__ import annotations

import os

from scorers.sandbox.cgroup import ENV, find
from scorers.sandbox.command import SANDBOX_UID
from scorers.sandbox.locate import SETPRIV, interpreter
from scorers.sandbox.results import Limits, SandboxUnavailable
from scorers.sandbox.run import run_sandboxed

_CHECK = "import os; print(os.getuid(), os.getpid())"


def probe(python: str) -> str:
    """Run one program in a sandbox and check it ran as the sandbox's uid, as pid > 1 of its own
    PID namespace; answer where sandboxes' cgroups are made (or why none: `cgroup.find`).
    SandboxUnavailable names what is missing: the env's bwrap, setpriv (a root scorer), user
    namespaces, a usable delegated cgroup where one is configured, or what bwrap said."""
    interpreter(python)  # the interpreter's install and the env's bwrap, or SandboxUnavailable
    if os.geteuid() == 0 and not os.access(SETPRIV, os.X_OK):
        raise SandboxUnavailable(
            f"{SETPRIV} (util-linux) is missing: a root scorer drops to an "
            "unprivileged uid with it before the sandbox starts"
        )
    place, where = find()
    result = run_sandboxed([python, "-I", "-c", _CHECK], python=python, limits=Limits(wall_s=30))
    words = result.stdout.split()
    if result.status != "exited" or result.returncode != 0 or len(words) != 2:
        cgroup = f"; sandboxes' cgroups: {where} ({ENV}=off runs without)" if place else ""
        raise SandboxUnavailable(
            f"a sandbox could not run {python} ({result.status}, exit {result.returncode}, "
            f"signal {result.signal}): {result.detail or result.stderr[-2000:]!r} (user "
            "namespaces must be allowed: sysctl user.max_user_namespaces > 0, and on Debian/Ubuntu "
            f"kernel.unprivileged_userns_clone=1 or an AppArmor profile for bwrap){cgroup}"
        )
    if int(words[0]) != SANDBOX_UID or int(words[1]) < 2:
        raise SandboxUnavailable(
            f"the sandbox ran {python} as uid/pid {words[:2]}, not as "
            f"uid {SANDBOX_UID} in a PID namespace of its own"
        )
    return "cgroup: " + where
