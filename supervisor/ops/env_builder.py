"""Building scorer envs (`managed-scorers envs build`, `make envs`) and reporting their state.

A build is `python -m venv` plus pip (pip's own configuration applies: index, find-links,
constraints), run from the spec's folder so relative paths in it mean the same from anywhere.
A `# key: a b` line in a spec names the packages `envs list` reports. A `# no-deps: a==1 b==2` line
installs those after the rest with `--no-deps --ignore-requires-python`: a framework whose published
metadata pins what its reward path never imports (a CUDA stack, another transformers) is installed
as its users do, with the few packages that path imports listed as ordinary lines; `pip check`
then ignores only what those packages declare.
The stamp (the hash of the spec's requirement lines, plus the pyproject.toml of any `-e`
project, and the interpreter's version and real path) is written last: an interrupted or failed
build is redone, never taken as built, and so is an env asked for with another interpreter.
The phases go to stderr as they start; pip, or uv under pip's settings (`uv_installer`), runs as
a watched step (`build_step`): its output passed on, or a line every 30 s while it works.
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
from typing import Protocol

from supervisor.ops.build_step import STEP_TIMEOUT_S, clean_environment, run_step
from supervisor.ops.uv_installer import find_uv, pip_settings, uv_arguments
from supervisor.scorer_envs import (
    MARKER,
    STAMP,
    EnvError,
    env_dir,
    envs_root,
    spec_names,
    spec_path,
)


def requirement_lines(requirements: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in requirements.read_text().splitlines())
    return [line for line in lines if line]


def key_packages(requirements: Path) -> list[str]:
    for line in requirements.read_text().splitlines():
        if line.startswith("# key:"):
            return line.removeprefix("# key:").split()
    return []


def no_deps_lines(requirements: Path) -> list[str]:
    """The requirements a `# no-deps:` line names (installed without their declared
    dependencies)."""
    found: list[str] = []
    for line in requirements.read_text().splitlines():
        if line.startswith("# no-deps:"):
            found += line.removeprefix("# no-deps:").split()
    return found


def spec_hash(requirements: Path) -> str:
    """What a build depends on: the requirement lines (comments aside) and each `-e` project's
    pyproject."""
    digest = hashlib.sha256()
    for line in requirement_lines(requirements):
        digest.update(line.encode() + b"\n")
        if line.startswith("-e "):
            pyproject = (requirements.parent / line[3:].strip()) / "pyproject.toml"
            digest.update(pyproject.read_bytes() if pyproject.is_file() else b"")
    for line in no_deps_lines(requirements):
        digest.update(b"no-deps " + line.encode() + b"\n")
    return digest.hexdigest()


@dataclass(frozen=True)
class Interpreter:
    """The python an env is built with: its version and its real path (None: an old venv's
    unrecorded)."""

    version: str
    path: str | None

    def same(self, other: Interpreter) -> bool:
        return self.version == other.version and None in (self.path, other.path) or self == other

    def __str__(self) -> str:
        return f"Python {self.version}" + (f" ({self.path})" if self.path else "")


@dataclass
class EnvStatus:
    name: str
    venv: Path
    built: bool
    pins_changed: bool  # built from other pins than the spec now says: rebuild
    # key package -> installed version
    packages: dict[str, str | None] = field(default_factory=dict)
    python: Interpreter | None = None  # what it was built with


def installed_versions(venv: Path, names: list[str]) -> dict[str, str | None]:
    """Versions installed in `venv`, read from its metadata (no process started)."""
    sites = sorted(venv.glob("lib/python*/site-packages"))
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions(path=[str(site) for site in sites]):
        found.setdefault(_normal(dist.metadata["Name"] or ""), dist.version)
    return {name: found.get(_normal(name)) for name in names}


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def read_stamp(venv: Path) -> tuple[str | None, Interpreter | None]:
    """The stamp's pins hash and interpreter (a stamp from before interpreters were recorded: the
    venv's pyvenv.cfg says it); (None, None) when there is no stamp."""
    stamp = venv / STAMP
    if not stamp.is_file():
        return None, None
    lines = stamp.read_text().splitlines()
    for line in lines[1:]:
        if line.startswith("python "):
            _, version, path = line.split(" ", 2)
            return lines[0].strip(), Interpreter(version, path)
    return (lines[0].strip() if lines else None), _from_pyvenv(venv / "pyvenv.cfg")


def _from_pyvenv(config: Path) -> Interpreter | None:
    if not config.is_file():
        return None
    values = dict(line.partition("=")[::2] for line in config.read_text().splitlines())
    values = {key.strip(): value.strip() for key, value in values.items()}
    version = values.get("version") or values.get("version_info")
    executable = values.get("executable")
    return (
        Interpreter(version, os.path.realpath(executable) if executable else None)
        if version
        else None
    )


def interpreter(python: str) -> Interpreter:
    """The version and real path of `python` (an executable, on PATH or by path), by asking it."""
    code = "import os, sys; print(sys.version.split()[0]); print(os.path.realpath(sys.executable))"
    try:
        done = subprocess.run(
            [python, "-c", code],
            env=clean_environment(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvError(f"--python {python} does not run: {exc}") from exc
    if done.returncode != 0 or len(done.stdout.split()) != 2:
        raise EnvError(
            f"--python {python} does not run (exit {done.returncode}): "
            f"{' '.join(done.stderr.split())[-500:]}"
        )
    version, path = done.stdout.split()
    return Interpreter(version, path)


def status(name: str, root: Path | None = None) -> EnvStatus:
    spec = spec_path(name)
    venv = env_dir(name, root)
    digest, python = read_stamp(venv)
    built = digest is not None and (venv / "bin" / "python").exists()
    changed = built and digest != spec_hash(spec)
    packages = installed_versions(venv, key_packages(spec)) if built else {}
    return EnvStatus(name, venv, built, changed, packages, python if built else None)


INSTALLERS = ("pip", "uv")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def build(
    requirements: Path,
    venv: Path,
    python: str | None = None,
    force: bool = False,
    say: Callable[[str], None] = _stderr,
    installer: str = "pip",
    verbosity: int = 0,
) -> bool:
    """Build `venv` from `requirements` unless it is built from the same pins and interpreter; True
    if it built.

    `python` makes the venv (default: the one it was built with, while that one is still there, else
    the interpreter running this, outside any venv); another interpreter than the one it was built
    with rebuilds it. `say` gets the phase lines (stderr by default), and at `verbosity` 1 or more
    the installer's own output. One build of a folder at a time (a lock beside it); only a folder
    this builder made is ever removed."""
    if installer not in INSTALLERS:
        raise EnvError(f"--installer {installer}: one of {', '.join(INSTALLERS)}")
    uv = find_uv() if installer == "uv" else None  # before anything changes
    if python is not None and shutil.which(python) is None:
        raise EnvError(f"--python {python} is not an executable: nothing was changed")
    if venv.resolve() == Path(sys.prefix).resolve():
        raise EnvError(f"{venv} is the environment running this command: choose another folder")
    venv.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(venv):
        want = spec_hash(requirements)
        digest, recorded = read_stamp(venv)
        target = interpreter(python) if python is not None else _default_interpreter(recorded)
        stale = _stale(venv, want, digest, recorded, target)
        if not force and stale is None:
            say(f"{venv}: up to date, built with {target}")
            return False
        say(f"{venv}: building from {requirements} with {target}: {stale or 'forced (--force)'}")
        began = time.monotonic()
        _remove_own(venv)
        _install(requirements, venv, target, uv, say, verbosity)
        (venv / STAMP).write_text(f"{want}\npython {target.version} {target.path}\n")
        say(f"{venv}: built in {time.monotonic() - began:.1f} s")
    return True


def _default_interpreter(recorded: Interpreter | None) -> Interpreter:
    """The interpreter the env was built with while it is still there (same version), else this
    one's base."""
    if recorded is not None and recorded.path is not None and os.access(recorded.path, os.X_OK):
        with contextlib.suppress(EnvError):  # it no longer runs: this one's base builds it again
            current = interpreter(recorded.path)
            if current.version == recorded.version:
                return current
    return interpreter(getattr(sys, "_base_executable", None) or sys.executable)


def _stale(
    venv: Path, want: str, digest: str | None, recorded: Interpreter | None, target: Interpreter
) -> str | None:
    """Why the env must be (re)built, or None when it is up to date."""
    if digest is None or not (venv / "bin" / "python").exists():
        return "not built"
    if digest != want:
        return "its pins changed"
    if recorded is None or not recorded.same(target):
        return f"it was built with {recorded or 'an unrecorded Python'}"
    return None


class _Step(Protocol):
    """`run_step` bound to one build's folder, phase lines and verbosity."""

    def __call__(
        self, command: list[str], what: str, env: dict[str, str] | None = None, echo: bool = True
    ) -> str: ...


def _install(
    requirements: Path,
    venv: Path,
    target: Interpreter,
    uv: str | None,
    say: Callable[[str], None],
    verbosity: int,
) -> None:
    """The venv, then its requirements (pip, or uv under pip's settings), then `pip check`: each a
    phase line."""
    cwd = requirements.parent

    def step(
        command: list[str], what: str, env: dict[str, str] | None = None, echo: bool = True
    ) -> str:
        return run_step(command, cwd, what, say, verbosity if echo else 0, env)

    say(f"  creating the venv with {target.path}")
    step([str(target.path), "-m", "venv", str(venv)], f"creating the venv {venv}")
    (venv / MARKER).write_text("made by managed-scorers envs build\n")
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip"]
    quiet = ["-v"] if verbosity > 1 else []
    _install_requirements(requirements, python, uv, step, say, quiet)
    unpinned = no_deps_lines(requirements)
    if unpinned:  # pip either way: uv has no --ignore-requires-python
        say(f"  installing {len(unpinned)} package(s) without their dependencies with pip")
        flags = ["--no-deps", "--ignore-requires-python"]
        step(
            [*pip, "install", "--no-input", "--progress-bar", "off", *quiet, *flags, *unpinned],
            "pip install --no-deps",
        )
    say("  checking the installed packages (pip check)")
    _check(pip, cwd, {_normal(re.split(r"[=<>!~\[ ]", line, maxsplit=1)[0]) for line in unpinned})


def _install_requirements(
    requirements: Path,
    python: str,
    uv: str | None,
    step: _Step,
    say: Callable[[str], None],
    quiet: list[str],
) -> None:
    """The spec's requirement lines into the venv at `python`: by pip, or by uv under the settings
    pip would use (its index, constraints)."""
    pip = [python, "-m", "pip"]
    count = len(requirement_lines(requirements))
    if not count:
        return  # a bare venv: nothing for the installer to do
    say(f"  installing {count} requirement line(s) with {'uv' if uv else 'pip'}")
    if uv is None:
        step(
            [
                *pip,
                "install",
                "--no-input",
                "--progress-bar",
                "off",
                *quiet,
                "-r",
                str(requirements),
            ],
            "pip install",
        )
    else:
        _uv_install(requirements, python, uv, step, quiet)


def _uv_install(requirements: Path, python: str, uv: str, step: _Step, quiet: list[str]) -> None:
    """`uv pip install` of the requirement lines, with the index, find-links and constraints that
    `pip config list` says pip would use."""
    pip = [python, "-m", "pip"]
    flags, variables = uv_arguments(
        pip_settings(step([*pip, "config", "list"], "pip config list", echo=False))
    )
    command = [
        uv,
        "pip",
        "install",
        "--python",
        python,
        *flags,
        *quiet,
        "-r",
        str(requirements),
    ]
    step(command, "uv pip install", {**clean_environment(), **variables})


def remove(name: str, root: Path | None = None, say: Callable[[str], None] = _stderr) -> bool:
    """Remove ROOT/NAME/.venv, an env this builder made; True if it was there. NAME is a spec's or
    an env's under ROOT; a symbolic link on the way is refused (what it points to is never
    touched)."""
    base = root or envs_root()
    built = {path.parent.name for path in base.glob("*/.venv")} if base.is_dir() else set()
    known = sorted(set(spec_names()) | built)
    if name not in known or name in (".", "..") or "/" in name:
        raise EnvError(f"no env named {name!r} under {base} (envs: {', '.join(known)})")
    venv = env_dir(name, base)
    for path in (venv.parent, venv):
        if path.is_symlink():
            raise EnvError(
                f"{path} is a symbolic link: not removed (this command removes only folders "
                f"under {base})"
            )
    if not venv.exists():
        say(f"{venv}: not built, nothing to remove")
        return False
    with _build_lock(venv):  # not while a build of it runs
        _remove_own(venv)
    say(f"{venv}: removed")
    return True


def _check(pip: list[str], cwd: Path, exempt: set[str]) -> None:
    """`pip check`, except for what the packages installed without their dependencies declare."""

    def others(output: str) -> bool:
        return any(
            _normal(line.split(" ", 1)[0]) not in exempt
            for line in output.splitlines()
            if line.strip()
        )

    run_step([*pip, "check"], cwd, "pip check", _stderr, fails=others)


def _remove_own(venv: Path) -> None:
    """Remove an env this builder made (stamped or marked), or an empty folder; refuse anything
    else."""
    if not venv.exists():
        return
    if not venv.is_dir():
        raise EnvError(f"{venv} is a file, not a folder for an env")
    ours = (venv / STAMP).exists() or (venv / MARKER).exists()
    if not ours and any(venv.iterdir()):
        raise EnvError(
            f"{venv} exists and was not made by managed-scorers envs build: remove it or "
            f"choose another folder"
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
                    raise EnvError(
                        f"another build of {venv} held its lock for {STEP_TIMEOUT_S:.0f} s"
                    ) from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
