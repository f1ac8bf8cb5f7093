"""The scorer contract and catalog (`base`, `registry`), the built-in scorers (`builtin/`),
`grading/` and `common/`.

The names below load on first use (PEP 562), not when the package is imported: the child
arms its parent-death watch from `scorers.common.processes` (stdlib only) before anything
heavy, and an interpreter without numpy must still reach the child's own diagnosis.

Importing it refuses, with `scorers.install.SupervisordClash` (an ImportError of one line), where
supervisord's files share our `supervisor` package: that install is broken, and every import of
this project says so before anything fails elsewhere.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from scorers import aliases, install

# a scorer child returns at one stat: its path holds no `supervisor`
install.refuse_supervisord_clash()
# `scorers.math_verify` and the other built-ins' old names: the modules of `scorers.builtin`
aliases.install()

if TYPE_CHECKING:
    from scorers.base import ScoreItem, Scorer, ScoreResult, ScorerSpec
    from scorers.registry import registered_names, resolve_scorer

_WHERE = {
    "ScoreItem": "scorers.base",
    "ScoreResult": "scorers.base",
    "Scorer": "scorers.base",
    "ScorerSpec": "scorers.base",
    "registered_names": "scorers.registry",
    "resolve_scorer": "scorers.registry",
}
__all__ = ["ScoreItem", "ScoreResult", "Scorer", "ScorerSpec", "resolve_scorer", "registered_names"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'scorers' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
