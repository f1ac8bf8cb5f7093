"""Scorer envs by name: the specs this package ships and where their envs live.

A spec is a pinned requirements file shipped in the package (`supervisor/env_specs/NAME.txt`).
The env NAME lives at ROOT/NAME/.venv, ROOT being $MANAGED_SCORERS_ENVS, else the checkout's
envs/ when this package runs from one, else $XDG_DATA_HOME/managed-scorers/envs
(~/.local/share/...). An env counts as built once its stamp is written (the builder,
`supervisor.ops.env_builder`, writes it last). Config reads this to turn `env: NAME` into a Python.
"""

from __future__ import annotations

import os
from pathlib import Path

from supervisor.errors import ConfigError

SPECS_DIR = Path(__file__).resolve().parent / "env_specs"
_SOURCE = SPECS_DIR.parent.parent
# Run from a source checkout (editable install included), envs live in its envs/ folder.
CHECKOUT_ENVS = (
    _SOURCE / "envs"
    if (_SOURCE / "pyproject.toml").is_file() and (_SOURCE / "envs").is_dir()
    else None
)
STAMP = ".requirements.sha256"
# written right after the venv is made: a folder this builder may remove
MARKER = ".managed-scorers-env"
ROOT_VARIABLE = "MANAGED_SCORERS_ENVS"


class EnvError(ConfigError):
    """A scorer env is unknown, not built, or failed to build (the message says which, and the
    fix)."""


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
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "share"
    )
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
            + (
                f" (with {ROOT_VARIABLE}={venv.parent.parent})"
                if root is None and ROOT_VARIABLE in os.environ
                else ""
            )
        )
    return python
