"""Building scorer envs (`managed-scorers envs build`, `make envs`) and reporting their state.

A build is `python -m venv` plus pip (pip's own configuration applies: index, find-links,
constraints), run from the spec's folder so relative paths in it mean the same from anywhere.
A `# key: a b` line in a spec names the packages `envs list` reports. A `# no-deps: a==1 b==2` line
installs those after the rest with `--no-deps --ignore-requires-python`: a framework whose published
metadata pins what its reward path never imports (a CUDA stack, another transformers) is installed
as its users do, with the few packages that path imports listed as ordinary lines; `pip check`
then ignores only what those packages declare.
The stamp (the hash of the spec's requirement lines, plus the pyproject.toml of any `-e`
project) is written last: an interrupted or failed build is redone, never taken as built.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.scorer_envs import MARKER, STAMP, EnvError, env_dir, spec_path

PIP_TAIL_CHARS = 4000
STEP_TIMEOUT_S = 3600.0  # one venv or pip step (the embed env downloads ~1.5 GB on a cold cache)


def requirement_lines(requirements: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in requirements.read_text().splitlines())
    return [line for line in lines if line]


def key_packages(requirements: Path) -> list[str]:
    for line in requirements.read_text().splitlines():
        if line.startswith("# key:"):
            return line.removeprefix("# key:").split()
    return []


def no_deps_lines(requirements: Path) -> list[str]:
    """The requirements a `# no-deps:` line names (installed without their declared dependencies)."""
    found: list[str] = []
    for line in requirements.read_text().splitlines():
        if line.startswith("# no-deps:"):
            found += line.removeprefix("# no-deps:").split()
    return found


def spec_hash(requirements: Path) -> str:
    """What a build depends on: the requirement lines (comments aside) and each `-e` project's pyproject."""
    digest = hashlib.sha256()
    for line in requirement_lines(requirements):
        digest.update(line.encode() + b"\n")
        if line.startswith("-e "):
            pyproject = (requirements.parent / line[3:].strip()) / "pyproject.toml"
            digest.update(pyproject.read_bytes() if pyproject.is_file() else b"")
    for line in no_deps_lines(requirements):
        digest.update(b"no-deps " + line.encode() + b"\n")
    return digest.hexdigest()


@dataclass
class EnvStatus:
    name: str
    venv: Path
    built: bool
    pins_changed: bool  # built from other pins than the spec now says: rebuild
    packages: dict[str, str | None] = field(default_factory=dict)  # key package -> installed version


def installed_versions(venv: Path, names: list[str]) -> dict[str, str | None]:
    """Versions installed in `venv`, read from its metadata (no process started)."""
    sites = sorted(venv.glob("lib/python*/site-packages"))
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions(path=[str(site) for site in sites]):
        found.setdefault(_normal(dist.metadata["Name"] or ""), dist.version)
    return {name: found.get(_normal(name)) for name in names}


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def status(name: str, root: Path | None = None) -> EnvStatus:
    spec = spec_path(name)
    venv = env_dir(name, root)
    stamp = venv / STAMP
    built = stamp.is_file() and (venv / "bin" / "python").exists()
    changed = built and stamp.read_text().strip() != spec_hash(spec)
    packages = installed_versions(venv, key_packages(spec)) if built else {}
    return EnvStatus(name, venv, built, changed, packages)


def build(
    requirements: Path,
    venv: Path,
    python: str | None = None,
    force: bool = False,
    say: Callable[[str], None] = print,
) -> bool:
    """Build `venv` from `requirements` unless it is built from the same pins; True if it built.

    `python` makes the venv (default: the interpreter running this, outside any venv). One build
    of a folder at a time (a lock beside it); only a folder this builder made is ever removed."""
    base: str = python or getattr(sys, "_base_executable", None) or sys.executable
    if shutil.which(base) is None:
        raise EnvError(f"--python {base} is not an executable: nothing was changed")
    if venv.resolve() == Path(sys.prefix).resolve():
        raise EnvError(f"{venv} is the environment running this command: choose another folder")
    venv.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(venv):
        want = spec_hash(requirements)
        stamp = venv / STAMP
        if not force and stamp.is_file() and stamp.read_text().strip() == want and (venv / "bin" / "python").exists():
            say(f"{venv}: up to date")
            return False
        say(f"{venv}: building from {requirements}")
        _remove_own(venv)
        _run([base, "-m", "venv", str(venv)], requirements.parent, f"creating the venv {venv} with {base}")
        (venv / MARKER).write_text("made by managed-scorers envs build\n")
        pip = [str(venv / "bin" / "python"), "-m", "pip"]
        _run([*pip, "install", "-q", "--no-input", "-r", str(requirements)], requirements.parent, "pip install")
        unpinned = no_deps_lines(requirements)
        if unpinned:
            flags = ["--no-deps", "--ignore-requires-python"]
            _run([*pip, "install", "-q", "--no-input", *flags, *unpinned], requirements.parent, "pip install --no-deps")
        _check(pip, requirements.parent, {_normal(re.split(r"[=<>!~\[ ]", line, maxsplit=1)[0]) for line in unpinned})
        stamp.write_text(want + "\n")
    return True


def _check(pip: list[str], cwd: Path, exempt: set[str]) -> None:
    """`pip check`, except for what the packages installed without their dependencies declare."""

    def others(output: str) -> bool:
        return any(_normal(line.split(" ", 1)[0]) not in exempt for line in output.splitlines() if line.strip())

    _run([*pip, "check"], cwd, "pip check", fails=others)


def _remove_own(venv: Path) -> None:
    """Remove an env this builder made (stamped or marked), or an empty folder; refuse anything else."""
    if not venv.exists():
        return
    if not venv.is_dir():
        raise EnvError(f"{venv} is a file, not a folder for an env")
    ours = (venv / STAMP).exists() or (venv / MARKER).exists()
    if not ours and any(venv.iterdir()):
        raise EnvError(
            f"{venv} exists and was not made by managed-scorers envs build: remove it or choose another folder"
        )
    try:
        shutil.rmtree(venv)
    except OSError as exc:
        raise EnvError(f"cannot remove the old env {venv}: {exc}") from exc


@contextlib.contextmanager
def _build_lock(venv: Path) -> Iterator[None]:
    """An exclusive lock on `venv`'s build, waited for up to one build step's deadline."""
    with open(venv.parent / f".{venv.name}.build-lock", "w") as handle:
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise EnvError(f"another build of {venv} held its lock for {STEP_TIMEOUT_S:.0f} s") from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _clean_environment() -> dict[str, str]:
    """This process's environment without what would make pip see other packages as installed."""
    dropped = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PIP_USER", "PIP_TARGET", "PIP_PREFIX", "VIRTUAL_ENV"}
    env = {key: value for key, value in os.environ.items() if key not in dropped}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _run(command: list[str], cwd: Path, what: str, fails: Callable[[str], bool] = lambda output: True) -> None:
    """Run one build step; a non-zero exit is an EnvError with pip's tail unless `fails(output)` forgives it."""
    try:
        done = subprocess.run(
            command, cwd=cwd, env=_clean_environment(), capture_output=True, text=True, timeout=STEP_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as exc:
        raise EnvError(f"{what} took longer than {STEP_TIMEOUT_S:.0f} s and was stopped") from exc
    except OSError as exc:
        raise EnvError(f"{what}: cannot run {command[0]}: {exc}") from exc
    noise = "WARNING: Location"  # pip's note on each missing local index folder
    output = "\n".join(line for line in (done.stdout + done.stderr).splitlines() if not line.startswith(noise))
    if done.returncode != 0 and fails(output):
        raise EnvError(f"{what} failed (exit {done.returncode}): {output[-PIP_TAIL_CHARS:]}")
