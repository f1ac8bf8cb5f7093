"""Scorer envs by name: the specs this package ships, where they live, and how they are built.

A spec is a pinned requirements file shipped in the package (`supervisor/env_specs/NAME.txt`),
so an installed managed-scorers can build its envs anywhere; a `# key: a b` line names the
packages `envs list` reports. The env NAME lives at ROOT/NAME/.venv, ROOT being
$MANAGED_SCORERS_ENVS, else the checkout's envs/ when this package runs from one, else
$XDG_DATA_HOME/managed-scorers/envs (~/.local/share/...).
A build is `python -m venv` plus pip (pip's own configuration applies: index, find-links,
constraints), run from the spec's folder so relative paths in it mean the same from anywhere.
The stamp (the hash of the spec's requirement lines, plus the pyproject.toml of any `-e`
project) is written last: an interrupted or failed build is redone, never taken as built.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.errors import ConfigError

SPECS_DIR = Path(__file__).resolve().parent / "env_specs"
_SOURCE = SPECS_DIR.parent.parent
# Run from a source checkout (editable install included), envs live in its envs/ folder.
CHECKOUT_ENVS = _SOURCE / "envs" if (_SOURCE / "pyproject.toml").is_file() and (_SOURCE / "envs").is_dir() else None
STAMP = ".requirements.sha256"
ROOT_VARIABLE = "MANAGED_SCORERS_ENVS"
PIP_TAIL_CHARS = 4000
STEP_TIMEOUT_S = 3600.0  # one venv or pip step (the embed env downloads ~1.5 GB on a cold cache)


class EnvError(ConfigError):
    """A scorer env is unknown, not built, or failed to build (the message says which, and the fix)."""


def spec_names() -> list[str]:
    return sorted(path.stem for path in SPECS_DIR.glob("*.txt"))


def spec_path(name: str) -> Path:
    path = SPECS_DIR / f"{name}.txt"
    if not path.is_file():
        raise EnvError(f"no scorer env spec named {name!r} (known: {', '.join(spec_names())})")
    return path


def envs_root() -> Path:
    configured = os.environ.get(ROOT_VARIABLE)
    if configured:
        return Path(configured).expanduser().absolute()
    if CHECKOUT_ENVS is not None:
        return CHECKOUT_ENVS
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data) / "managed-scorers" / "envs"


def env_dir(name: str, root: Path | None = None) -> Path:
    return (root or envs_root()) / name / ".venv"


def env_python(name: str, root: Path | None = None) -> Path:
    """The python of the built env NAME; EnvError with the command to run when it is not built."""
    venv = env_dir(name, root)
    python = venv / "bin" / "python"
    if not (venv / STAMP).is_file() or not python.exists():
        if name not in spec_names():
            raise EnvError(
                f"no scorer env {name!r} at {venv}, and no spec of that name to build (specs: "
                f"{', '.join(spec_names())}); or give process.python_executable"
            )
        raise EnvError(
            f"scorer env {name!r} is not built at {venv}: run `managed-scorers envs build {name}`"
            + (f" (with {ROOT_VARIABLE}={venv.parent.parent})" if root is None and ROOT_VARIABLE in os.environ else "")
        )
    return python


def requirement_lines(requirements: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in requirements.read_text().splitlines())
    return [line for line in lines if line]


def key_packages(requirements: Path) -> list[str]:
    for line in requirements.read_text().splitlines():
        if line.startswith("# key:"):
            return line.removeprefix("# key:").split()
    return []


def spec_hash(requirements: Path) -> str:
    """What a build depends on: the requirement lines (comments aside) and each `-e` project's pyproject."""
    digest = hashlib.sha256()
    for line in requirement_lines(requirements):
        digest.update(line.encode() + b"\n")
        if line.startswith("-e "):
            pyproject = (requirements.parent / line[3:].strip()) / "pyproject.toml"
            digest.update(pyproject.read_bytes() if pyproject.is_file() else b"")
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

    `python` makes the venv (default: the interpreter running this, outside any venv)."""
    want = spec_hash(requirements)
    stamp = venv / STAMP
    if not force and stamp.is_file() and stamp.read_text().strip() == want and (venv / "bin" / "python").exists():
        say(f"{venv}: up to date")
        return False
    say(f"{venv}: building from {requirements}")
    if venv.exists():
        if not (venv / "pyvenv.cfg").is_file() and any(venv.iterdir()):  # never wipe a folder that is not a venv
            raise EnvError(f"{venv} exists and is not a venv: remove it or choose another folder")
        try:
            shutil.rmtree(venv)
        except OSError as exc:
            raise EnvError(f"cannot remove the old env {venv}: {exc}") from exc
    venv.parent.mkdir(parents=True, exist_ok=True)
    base: str = python or getattr(sys, "_base_executable", None) or sys.executable
    _run([base, "-m", "venv", str(venv)], requirements.parent, f"creating the venv {venv} with {base}")
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    _run([*pip, "install", "-q", "--no-input", "-r", str(requirements)], requirements.parent, "pip install")
    _run([*pip, "check"], requirements.parent, "pip check")
    stamp.write_text(want + "\n")
    return True


def _run(command: list[str], cwd: Path, what: str) -> None:
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise EnvError(f"{what} took longer than {STEP_TIMEOUT_S:.0f} s and was stopped") from exc
    noise = "WARNING: Location"  # pip's note on each missing local index folder
    output = "\n".join(line for line in (done.stdout + done.stderr).splitlines() if not line.startswith(noise))
    if done.returncode != 0:
        raise EnvError(f"{what} failed (exit {done.returncode}): {output[-PIP_TAIL_CHARS:]}")
