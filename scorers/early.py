"""Early starts: helpers a scorer's child launches before its own imports, named on its command
line.

The parent passes `--early NAME` (`early_args`) for a scorer with a hook here; the child runtime
calls `run(NAME)` first thing, before it imports numpy and its HTTP server, so that the helper's own
start (a forkserver importing math_verify) overlaps them. Stdlib only. A hook that fails is logged
and skipped: the scorer's pool starts the same helper, and reports its failure the normal way
(math_verify: as the first score call's error, since its load() does not wait for the pool).
"""

from __future__ import annotations

import importlib
import sys

HOOKS = {"math_verify": "scorers.builtin.math_verify_boot:start_early"}
FLAG = "--early"


def early_args(scorer_name: str) -> list[str]:
    return [FLAG, scorer_name] if scorer_name in HOOKS else []


def run_from_argv(argv: list[str]) -> None:
    """The hook `argv` names (`--early NAME`), if any."""
    if FLAG not in argv:
        return
    position = argv.index(FLAG) + 1
    name = argv[position] if position < len(argv) else ""
    try:
        module, _, function = HOOKS[name].partition(":")
        getattr(importlib.import_module(module), function)()
    except Exception as exc:  # noqa: BLE001 - an optimisation only: load() starts it again and says why it fails
        print(
            f"child_runtime: early start {name!r} skipped: {type(exc).__name__}: {exc}",
            file=sys.stderr,
            flush=True,
        )
