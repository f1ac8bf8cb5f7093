"""The built-in scorers' old module names (`scorers.math_verify`), importable after their move to
`scorers.builtin`: users' recipes, ports and catalogs name them
(`scorers.math_verify:MathVerifyScorer`).

One meta-path finder, not a shim file per module: an old name gives the very module object of its
new one, so a class is one class whichever name loaded it (`isinstance`, pickles, identity hashes
agree). Stdlib only: the package installs it when imported, before any scorer loads.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

NEW_PACKAGE = "scorers.builtin"
MOVED = frozenset(
    {
        "arithmetic",
        "audio",
        "clip_preference",
        "image_edit",
        "jpeg",
        "llm_judge",
        "math_verify",
        "math_verify_boot",
        "math_verify_grade",
        "math_verify_warm",
        "ocr",
        "pairwise",
        "rules",
        "task_rules",
        "text_similarity",
        "torch_probe",
        "video",
    }
)


def new_name(old: str) -> str | None:
    """`scorers.builtin.X` for a moved module's old name `scorers.X`; None for any other name."""
    package, _, leaf = old.rpartition(".")
    return f"{NEW_PACKAGE}.{leaf}" if package == "scorers" and leaf in MOVED else None


class _SameModule(importlib.abc.Loader):
    """Loads an old name as the module of its new name, imported (once) under that new name."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.own_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system set the old name's spec on it: give back its own
        module.__spec__ = self.own_spec


class OldNames(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        moved_to = new_name(fullname)
        if moved_to is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _SameModule(moved_to))


def install() -> None:
    """Put the finder first on `sys.meta_path` (once): an old name never reaches a stale file of its
    own."""
    if not any(isinstance(finder, OldNames) for finder in sys.meta_path):
        sys.meta_path.insert(0, OldNames())
