"""What this installation holds: supervisord sharing our `supervisor` package, and the extras a
command needs.

supervisord's distribution (`pip install supervisor`) ships a top-level `supervisor` package too.
Installed after managed-scorers, its `supervisor/__init__.py` replaces our facade, and
`from supervisor import RewardItem` fails while the CLI keeps working; installed before, both
share one folder, and uninstalling either deletes files of the other. Either way the fix is two
environments, so `scorers`, `child_runtime` (through `scorers`), the facade and the CLI refuse
here, in one line, rather than fail later somewhere else.

This module sits at the bottom of the floors (the stdlib only) and never imports `supervisor`:
it must run where supervisord's files replaced our facade. The check is cheap where it runs
most: a scorer child imports `scorers` from a folder holding links to `scorers` and
`child_runtime` only (supervisor/child/import_root.py), so one stat ends it there.
"""

from __future__ import annotations

import importlib.util
import os

# The line our facade (supervisor/__init__.py) holds, and supervisord's does not.
FACADE_MARK = '__distribution__ = "managed-scorers"'
FIX = (
    "fix: keep them in separate environments (supervisord in its own, e.g. `pipx install "
    "supervisor`): here, `pip uninstall -y supervisor managed-scorers`, then install "
    "managed-scorers again"
)


class SupervisordClash(ImportError):
    """supervisord's files share our `supervisor` package: its one-line message names the fix."""

    supervisord_clash = True  # how the facade and the CLI tell it from any other ImportError


def _supervisord_version(folder: str) -> str | None:
    """The version of supervisord installed in `folder` (a site-packages), from its metadata
    folder's name."""
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    for name in names:  # supervisor-4.3.0.dist-info, supervisor-4.2.5-py3.11.egg-info
        stem, dot, kind = name.lower().rpartition(".")
        parts = stem.split("-")
        if (
            dot
            and kind in ("dist-info", "egg-info")
            and parts[0] == "supervisor"
            and len(parts) in (2, 3)
        ):
            return parts[1]
    return None


def _facade_origin() -> str | None:
    """The `__init__.py` that `import supervisor` runs here (found, not imported); None if none is
    found."""
    try:
        spec = importlib.util.find_spec("supervisor")
    except (ImportError, ValueError):  # a `supervisor` module without a spec: not ours
        return "an unknown module"
    if spec is None:
        return None
    return spec.origin or "a namespace package"


def _is_ours(origin: str) -> bool:
    try:
        with open(origin, encoding="utf-8") as facade:
            return FACADE_MARK in facade.read()
    except (OSError, UnicodeDecodeError):
        return False


def supervisord_clash() -> str | None:
    """The one line that says supervisord shares our `supervisor` package here, and the fix; None if
    not.

    Checked only where our `supervisor` package sits beside this `scorers` (a trainer's install or a
    checkout); a clash is supervisord's metadata in that folder, or a `supervisor` facade that is
    not ours.
    """
    home = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isdir(os.path.join(home, "supervisor")):
        return None  # a scorer child's import root: no trainer side here to clash
    origin = _facade_origin()
    folders = {home} | (
        {os.path.dirname(os.path.dirname(origin))} if origin and os.path.isabs(origin) else set()
    )
    versions = [version for folder in sorted(folders) if (version := _supervisord_version(folder))]
    replaced = origin is not None and not _is_ours(origin)
    if not versions and not replaced:
        return None
    who = f"supervisord {versions[0]} (pip package `supervisor`)" if versions else "supervisord"
    if not replaced:
        what = (
            f"{who} is installed beside managed-scorers and both own the `supervisor` package here"
        )
    # our __init__.py is gone: `pip uninstall supervisor` deletes it
    elif origin == "a namespace package":
        what = (
            f"managed-scorers' `supervisor/__init__.py` is missing (was {who} uninstalled "
            f"after it?)"
        )
    else:
        what = f"{who} owns the `supervisor` package here ({origin} is not managed-scorers'), "
        what += "so `from supervisor import ...` fails"
    return f"{what}; {FIX}"


def refuse_supervisord_clash() -> None:
    """Raise `SupervisordClash` (an ImportError) when supervisord shares our `supervisor` package
    here."""
    line = supervisord_clash()
    if line is not None:
        raise SupervisordClash(line, name="supervisor")


# What each extra enables (pyproject.toml's optional dependencies) and the modules that tell it is
# installed.
EXTRAS = {
    "serving": ("starlette", "uvicorn", "PIL"),
    "metrics": ("prometheus_client",),
    "ray": ("ray",),
    "parquet": ("pyarrow",),
    "datasets": ("datasets",),
    "video": ("av",),
}


def missing_extra(extra: str, needed_by: str, modules: tuple[str, ...] | None = None) -> str | None:
    """None when this python has `extra`'s modules (or just `modules` of it); else one line naming
    the install."""
    for module in modules if modules is not None else EXTRAS[extra]:
        if importlib.util.find_spec(module) is None:
            return (
                f"{needed_by} needs the {extra!r} extra, which this python ({module!r}) lacks: "
                f"pip install 'managed-scorers[{extra}]'"
            )
    return None
