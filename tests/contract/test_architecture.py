"""The floor plan of the product packages, checked from their source (docs/architecture.md).

Each folder may import only the floors below it, so the tree keeps showing the architecture:
no import cycle between modules, packages or folders, and no import that runs back up.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("scorers", "child_runtime", "supervisor")
# the shared low-level helpers: every side may import them, they import nothing of ours
FLOOR = "scorers.common"
# the scorers users pick by name, apart from the contract they implement
BUILTIN = "scorers.builtin"
# supervisor's floors, lowest first: a folder imports its own floor and those below, never above.
SUPERVISOR_FLOORS = (
    "supervisor",
    "supervisor.child",
    "supervisor.backends",
    "supervisor.compose",
    "supervisor.adapters",
)
# the package's public face may import anything of it
FACADES = {"supervisor", "supervisor.__main__"}
MAX_FUNCTION_LINES = 50  # a reader holds a function whole: longer ones are split by what they do


def _modules(packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()
BENCH_MODULES = _modules(("bench",))  # not a product package, but held to no cycle all the same
# what the bench lines share (`bench.common`), their inputs and typed handles, and the fake peers
# they talk to
BENCH_HELPERS = {
    "bench.common",
    "bench.workloads",
    "bench.handles",
    "bench.loopback_server",
    "bench.fake_openai",
    "bench.misbehaving_server",
    "bench.hard_limit",
}


def _resolve(name: str, known: dict[str, Path] = MODULES) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _imports(
    module: str, path: Path, known: dict[str, Path] = MODULES
) -> Iterator[tuple[str, int]]:
    """(imported module of `known`, line) for every import in the file, TYPE_CHECKING blocks
    included."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            names = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        for name in names:
            target = _resolve(name, known)
            if target is not None and target != module:
                yield target, node.lineno


EDGES = {module: sorted(set(_imports(module, path))) for module, path in MODULES.items()}
BENCH_EDGES = {
    module: sorted(set(_imports(module, path, BENCH_MODULES)))
    for module, path in BENCH_MODULES.items()
}


def _folder(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def _violations(rule: Callable[[str, str], bool]) -> list[str]:
    return [
        f"{MODULES[a].relative_to(ROOT)}:{line} imports {b}"
        for a, targets in EDGES.items()
        for b, line in targets
        if rule(a, b)
    ]


def _in(module: str, folder: str) -> bool:
    return module == folder or module.startswith(folder + ".")


def test_the_floor_imports_nothing_of_the_project():
    """`scorers.common`, the shared low-level helpers every side imports, imports only its own
    modules."""
    assert any(_in(module, FLOOR) for module in MODULES)
    assert _violations(lambda a, b: _in(a, FLOOR) and not _in(b, FLOOR)) == []


def test_scorers_import_nothing_above_them_and_grading_only_itself_and_the_floor():
    def rule(a: str, b: str) -> bool:
        if _in(a, "scorers.grading"):
            return not (_in(b, "scorers.grading") or _in(b, FLOOR))
        return a.startswith("scorers") and not b.startswith("scorers")

    assert _violations(rule) == []


def test_the_scorer_contract_never_imports_a_built_in_scorer():
    """The top of `scorers/` stands alone: the built-ins (`scorers.builtin`) import it, never the
    reverse."""
    assert any(_in(module, BUILTIN) for module in MODULES)
    assert (
        _violations(
            lambda a, b: a.startswith("scorers") and not _in(a, BUILTIN) and _in(b, BUILTIN)
        )
        == []
    )


# Beyond itself and the floor, what the child's protocol may import: the scorer contract and the
# item's declared fields.
PROTOCOL_MAY_IMPORT = ("scorers.base", "scorers.item_fields")


def test_the_child_never_imports_the_trainer_side_and_its_protocol_only_the_scorer_contract():
    def rule(a: str, b: str) -> bool:
        if a.startswith("child_runtime.protocol"):
            return not (
                b.startswith("child_runtime.protocol") or b in PROTOCOL_MAY_IMPORT or _in(b, FLOOR)
            )
        return a.startswith("child_runtime") and b.startswith("supervisor")

    assert _violations(rule) == []


def test_the_trainer_side_reaches_the_child_only_through_its_protocol():
    def rule(a: str, b: str) -> bool:
        return (
            a.startswith("supervisor")
            and b.startswith("child_runtime")
            and not b.startswith("child_runtime.protocol")
        )

    assert _violations(rule) == []


def _floor(module: str) -> int:
    """The floor of a supervisor module; ops/ sits above them all, and limits/ (a server of its own,
    as `serve` is, sharing its listening and token helpers) beside it."""
    folder = _folder(module)
    if folder.startswith(("supervisor.ops", "supervisor.limits")):
        return len(SUPERVISOR_FLOORS)
    return SUPERVISOR_FLOORS.index(folder)


# What a folder may import at module level beyond the stdlib and the project (heavy ones load inside
# `load()` or a function): longest prefix wins. The two math_verify modules run in grading workers,
# whose whole job is that import.
THIRD_PARTY = {
    # bounded_http only: processes and retry are stdlib only
    "scorers.common": {"httpx", "httpcore"},
    "scorers.grading": set(),
    "scorers": {"numpy"},
    "child_runtime.protocol": {"numpy"},
    "child_runtime": {"numpy", "starlette", "uvicorn"},
    "supervisor": {"numpy", "pydantic", "httpx", "psutil", "yaml"},
    # the coordinator's routes: the serving extra, imported only where it is served
    "supervisor.limits.app": {"starlette"},
}
IMPORTS_ITS_GRADER = {
    "scorers.builtin.math_verify_grade": {"math_verify"},
    "scorers.builtin.math_verify_warm": {"math_verify"},
}


def _module_level_imports(path: Path) -> Iterator[tuple[str, int]]:
    """Top-level package names imported when the module is (not inside a function), `TYPE_CHECKING`
    aside."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for inner in ast.walk(node) if isinstance(node, (ast.If, ast.Try, ast.With)) else [node]:
            if isinstance(inner, ast.Import):
                yield from ((alias.name.split(".")[0], inner.lineno) for alias in inner.names)
            elif isinstance(inner, ast.ImportFrom) and not inner.level and inner.module:
                yield inner.module.split(".")[0], inner.lineno


def test_each_folder_imports_only_its_declared_third_party_packages_at_import_time():
    ours = {*PACKAGES, "__future__"}
    wrong = []
    for module, path in MODULES.items():
        folder = max((f for f in THIRD_PARTY if module == f or module.startswith(f + ".")), key=len)
        allowed = THIRD_PARTY[folder] | IMPORTS_ITS_GRADER.get(module, set())
        for name, line in _module_level_imports(path):
            if name not in sys.stdlib_module_names and name not in ours and name not in allowed:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name} at import time")
    assert wrong == []


def test_each_supervisor_folder_imports_only_its_floor_and_those_below():
    def rule(a: str, b: str) -> bool:
        if a in FACADES or not (a.startswith("supervisor") and b.startswith("supervisor")):
            return False
        if b in FACADES:
            return True  # a module importing the facade would import every floor
        if a.startswith("supervisor.ops") and b.startswith("supervisor.adapters"):
            return True  # the operator's tools never drive a trainer's call shapes
        return _floor(b) > _floor(a)

    assert _violations(rule) == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = [stack.pop()]
            while component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in list(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_between_modules_or_folders():
    modules = {a: {b for b, _ in targets} for a, targets in EDGES.items()}
    folders: dict[str, set[str]] = defaultdict(set)
    for a, targets in modules.items():
        if a in FACADES:
            continue
        folders[_folder(a)].update(_folder(b) for b in targets if _folder(b) != _folder(a))
    packages: dict[str, set[str]] = defaultdict(set)
    for a, targets in modules.items():
        packages[a.split(".")[0]].update(
            b.split(".")[0] for b in targets if b.split(".")[0] != a.split(".")[0]
        )
    bench = {a: {b for b, _ in targets} for a, targets in BENCH_EDGES.items()}
    assert (
        _cycles(modules) == []
        and _cycles(folders) == []
        and _cycles(packages) == []
        and _cycles(bench) == []
    )


def test_bench_lines_import_only_the_shared_helpers_and_never_the_entry():
    """`python -m bench` imports its lines; a line imports `bench.common` and the other helpers,
    never `bench.__main__` or another line; a helper imports only helpers."""
    lines = {b for b, _ in BENCH_EDGES["bench.__main__"]} - BENCH_HELPERS
    wrong = [
        f"{BENCH_MODULES[a].relative_to(ROOT)}:{line} imports {b}"
        for a, targets in BENCH_EDGES.items()
        for b, line in targets
        if b == "bench.__main__" or (a in lines | BENCH_HELPERS and b not in BENCH_HELPERS)
    ]
    assert lines and BENCH_HELPERS <= set(BENCH_MODULES) and wrong == []


@pytest.mark.parametrize("package", PACKAGES)
def test_every_product_function_fits_on_a_screen(package):
    long = []
    for module, path in MODULES.items():
        if module.split(".")[0] != package:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    key = f"{path.relative_to(ROOT)}:{node.name}"
                    long.append(f"{key} at line {node.lineno} ({length} lines)")
    assert long == []


def test_the_error_tree_is_drawn_and_single_inheritance():
    import inspect

    import supervisor.errors as errors

    drawn = errors.__doc__ or ""
    classes = [
        c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__
    ]
    assert [c.__name__ for c in classes if len(c.__bases__) > 1] == []
    scorer_errors = [c for c in classes if issubclass(c, errors.ScorerError)]
    assert [c.__name__ for c in scorer_errors if f" {c.__name__} " not in drawn] == []


def test_no_result_is_read_back_from_an_exception_inside_the_library():
    """Results travel as values (supervisor.outcome); `partial` is the trainer's read-only copy."""
    reads = []
    for module, path in MODULES.items():
        if module == "supervisor.errors":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "partial"
                and isinstance(node.ctx, ast.Load)
            ):
                owner = node.value.id if isinstance(node.value, ast.Name) else ""
                # score_dataset's count of partial rows, not an error's
                if owner not in ("self", "summary"):
                    reads.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert reads == []
