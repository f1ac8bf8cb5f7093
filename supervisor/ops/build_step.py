"""One step of an env build (venv, pip, uv) run as a child, watched: nothing goes silent for
minutes.

At verbosity 0 the step's output is kept (its tail goes into the error when it fails) and a line
every HEARTBEAT_S says it still runs, with its last output line (what pip is collecting); at 1 and
above every output line is passed on as it comes. A step past STEP_TIMEOUT_S is killed and fails.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from supervisor.scorer_envs import EnvError

PIP_TAIL_CHARS = 4000
STEP_TIMEOUT_S = 3600.0  # one venv or pip step (the embed env downloads ~1.5 GB on a cold cache)
HEARTBEAT_S = 30.0
NOISE = "WARNING: Location"  # pip's note on each missing local index folder


def clean_environment() -> dict[str, str]:
    """This process's environment without what would make pip see other packages as installed."""
    dropped = {
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PIP_USER",
        "PIP_TARGET",
        "PIP_PREFIX",
        "VIRTUAL_ENV",
    }
    env = {key: value for key, value in os.environ.items() if key not in dropped}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def run_step(
    command: list[str],
    cwd: Path,
    what: str,
    say: Callable[[str], None],
    verbosity: int = 0,
    env: dict[str, str] | None = None,
    fails: Callable[[str], bool] = lambda output: True,
    heartbeat_s: float = HEARTBEAT_S,
) -> str:
    """Run one build step and return its output; a non-zero exit is an EnvError with the output's
    tail unless `fails(output)` forgives it."""
    child = _start(command, cwd, what, env)
    lines: list[str] = []
    reader = threading.Thread(
        target=_pump, args=(child, lines, say if verbosity > 0 else None), daemon=True
    )
    reader.start()
    try:
        _wait(child, lines, what, say, verbosity, heartbeat_s)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        reader.join()
    output = "\n".join(lines)
    if child.returncode != 0 and fails(output):
        raise EnvError(f"{what} failed (exit {child.returncode}): {output[-PIP_TAIL_CHARS:]}")
    return output


def _start(
    command: list[str], cwd: Path, what: str, env: dict[str, str] | None
) -> subprocess.Popen[str]:
    """The step's child, its output and errors on one pipe (an executable that cannot run: an
    EnvError)."""
    try:
        return subprocess.Popen(
            command,
            cwd=cwd,
            env=env if env is not None else clean_environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
    except OSError as exc:
        raise EnvError(f"{what}: cannot run {command[0]}: {exc}") from exc


def _wait(
    child: subprocess.Popen[str],
    lines: list[str],
    what: str,
    say: Callable[[str], None],
    verbosity: int,
    heartbeat_s: float,
) -> None:
    """Wait for the step to exit, saying every `heartbeat_s` that it still runs (at verbosity 0),
    and stop waiting past STEP_TIMEOUT_S with an EnvError (the caller kills the child)."""
    began = time.monotonic()
    while True:
        try:
            child.wait(timeout=heartbeat_s)
            return
        except subprocess.TimeoutExpired:
            elapsed = time.monotonic() - began
            if elapsed > STEP_TIMEOUT_S:
                raise EnvError(
                    f"{what} took longer than {STEP_TIMEOUT_S:.0f} s and was stopped"
                ) from None
            if verbosity == 0:
                last = f": {lines[-1].strip()[:120]}" if lines else ""
                say(f"  {what}: still running after {elapsed:.0f} s{last}")


def _pump(
    child: subprocess.Popen[str], lines: list[str], echo: Callable[[str], None] | None
) -> None:
    """Collect the child's output lines (pip's local-index noise aside), passing each on when
    echoing."""
    if child.stdout is None:
        return
    for raw in child.stdout:
        line = raw.rstrip("\n")
        if not line.strip() or line.startswith(NOISE):
            continue
        lines.append(line)
        if echo is not None:
            echo(line)
