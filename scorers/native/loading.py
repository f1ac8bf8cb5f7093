"""Finding a verl-omni native model class or score function in the model's env, by the references
verl-omni's recipes use: `module:Attr`, `pkg://module:Attr`, or a Python file path plus a name.

Runs in the child (the only process whose env can import them); any failure is a
`NativeSetupError` naming the reference, raised at load and so a boot failure.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
from types import ModuleType
from typing import Any

from scorers.registry import import_dotted

PKG = "pkg://"
_FILES: dict[str, ModuleType] = {}
_FILES_LOCK = threading.Lock()


class NativeSetupError(RuntimeError):
    """A native model or score function cannot be found, imported or called as configured."""


def split_reference(reference: str, what: str) -> tuple[str, str]:
    """`module:Attr`, `pkg://module:Attr` or `path/to/file.py:Attr` -> (module or file,
    attribute)."""
    if not isinstance(reference, str) or ":" not in reference.removeprefix(PKG):
        raise NativeSetupError(
            f"{what}: {reference!r} is not 'module:Class', 'pkg://module:Class' or 'file.py:Class'"
        )
    where, _, attr = reference.removeprefix(PKG).rpartition(":")
    return (PKG + where if reference.startswith(PKG) else where), attr


def is_file(where: str) -> bool:
    return not where.startswith(PKG) and (where.endswith(".py") or os.sep in where)


def load_attribute(where: str, attr: str, what: str) -> Any:
    """`attr` of the module `where` names: a dotted module (with or without pkg://) or a .py
    file."""
    if not attr:
        raise NativeSetupError(f"{what}: no name given to take from {where!r}")
    if not is_file(where):
        return import_dotted(f"{where.removeprefix(PKG)}:{attr}", what, NativeSetupError)
    module = _file_module(where, what)
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise NativeSetupError(f"{what}: file {where!r} has no {attr!r}") from exc


def _file_module(path: str, what: str) -> ModuleType:
    """The module of one .py file, executed once per process however many names are taken from
    it."""
    absolute = os.path.abspath(path)
    with _FILES_LOCK:
        if absolute in _FILES:
            return _FILES[absolute]
        name = "native_" + hashlib.sha256(absolute.encode()).hexdigest()[:16]
        spec = importlib.util.spec_from_file_location(name, absolute)
        if spec is None or spec.loader is None or not os.path.isfile(absolute):
            raise NativeSetupError(f"{what}: {absolute!r} is not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look their module up here
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise NativeSetupError(
                f"{what}: importing {absolute!r} failed: {type(exc).__name__}: {exc}"
            ) from exc
        _FILES[absolute] = module
        return module
