"""Shape figures of the product code (issue 40): RewardBackend's public names, the largest
constructors, lines over 100 columns, the classes with the most methods.

Run from the repo root: `.venv/bin/python docs/code_shape.py` (or `... docs/code_shape.py DIR`
for another checkout, e.g. a `git worktree` of an older commit).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGES = ("supervisor", "child_runtime", "scorers")


def main(root: Path) -> None:
    sys.path.insert(0, str(root))
    from supervisor.backend import RewardBackend

    names = sorted(name for name in dir(RewardBackend) if not name.startswith("_"))
    print("RewardBackend public names:", len(names), names)
    constructors, classes, long = [], [], 0
    for path in sorted(p for package in PACKAGES for p in (root / package).rglob("*.py")):
        text = path.read_text()
        long += sum(len(line) > 100 for line in text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.ClassDef):
                continue
            functions = (ast.FunctionDef, ast.AsyncFunctionDef)
            methods = [n for n in node.body if isinstance(n, functions)]
            where = f"{path.relative_to(root)}:{node.name}"
            classes.append((len(methods), where))
            for method in methods:
                if method.name == "__init__":
                    count = len(method.args.args) - 1 + len(method.args.kwonlyargs)
                    constructors.append((count, where))
    print("product lines over 100 columns:", long)
    print("largest constructors:", sorted(constructors, reverse=True)[:6])
    print("classes with most methods:", sorted(classes, reverse=True)[:6])


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve())
