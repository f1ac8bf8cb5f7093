"""The directory a child imports this project from: links to our own child-side packages, nothing
else.

Why: the child's import path must hold the scorer env and this project's code, never
the trainer's environment. Installed with pip, our packages sit in the trainer's
site-packages beside everything else the trainer has (antlr 4.9.3, say), so that
directory cannot go on the child's path. Instead the child gets a private directory
whose only entries are links to `child_runtime` and `scorers`: the same mechanism for
a checkout and for an installed package. User scorer modules reach the child only
through `process.extra_import_paths`, listed after it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

CHILD_PACKAGES = ("child_runtime", "scorers")


def package_dirs() -> dict[str, Path]:
    """Where this installation's child-side packages live (found without importing them)."""
    found = {}
    for name in CHILD_PACKAGES:
        spec = importlib.util.find_spec(name)
        locations = list(spec.submodule_search_locations or []) if spec else []
        if len(locations) != 1:
            raise ImportError(
                f"cannot locate package {name!r} of managed-scorers (found {locations})"
            )
        found[name] = Path(locations[0]).resolve()
    return found


def _holds(root: Path, dirs: dict[str, Path]) -> bool:
    try:
        entries = sorted(os.listdir(root))
        return entries == sorted(dirs) and all(
            os.readlink(root / name) == str(target) for name, target in dirs.items()
        )
    except OSError:
        return False


def import_root(base: Path) -> Path:
    """A directory under `base` (private to this user) holding exactly the links to our packages.

    Created atomically (links in a temporary directory, then one rename), so ranks
    launching together all get the same complete directory.
    """
    dirs = package_dirs()
    digest = hashlib.sha256("\0".join(str(d) for d in dirs.values()).encode()).hexdigest()[:16]
    root = base / f"import-root-{digest}"
    if _holds(root, dirs):
        return root
    staging = Path(tempfile.mkdtemp(prefix=".import-root-", dir=base))
    for name, target in dirs.items():
        (staging / name).symlink_to(target, target_is_directory=True)
    try:
        os.rename(staging, root)
    except OSError:  # another launch made it first, or a stale one is in the way
        if not _holds(root, dirs):
            stale = Path(tempfile.mkdtemp(prefix=".stale-", dir=base))
            os.rename(root, stale / "root")
            shutil.rmtree(stale)
            try:
                os.rename(staging, root)
            except OSError:
                if not _holds(root, dirs):
                    raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root
