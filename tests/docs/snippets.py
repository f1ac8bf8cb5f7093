"""The snippet runner: finds every fenced code block of a markdown file and checks it.

The rules (docs/contributing.md says them for authors):

- ```python: run as a standalone script by the repo's .venv python, in a fresh temp dir, with
  MANAGED_SCORERS_ENVS=<repo>/envs and PYTHONPATH=<repo>; it must exit 0 within 60 s.
- ```yaml: a reward recipe, loaded by `supervisor.compose.recipes.load_recipe`; after the line
  `<!-- yaml: not a recipe (REASON) -->` only parsed by yaml.safe_load.
- ```bash, ```sh, ```shell, ```console: run by `bash -euo pipefail` in the repo root, with .venv/bin
  first on PATH and MANAGED_SCORERS_ENVS=<repo>/envs, within 120 s; in a console block with `$ `
  prompts only the prompted lines (and their continuations) run, the rest is output.
- ```json must parse. ```text, ```toml, unlabelled and other blocks are not run.
- `<!-- not run: REASON -->` on the line right before the opening fence skips a block, saying why;
  the marker without a reason fails, and so does a marker that is not right before a fence.

Every process a block starts must be gone when it ends: each block runs under a small supervisor
(a child subreaper, so that even a detached grandchild comes back to it) that waits a grace
period for stragglers, then kills them and reports them as leaked, which fails the block.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
PYTHON_DEADLINE_S = 60.0
SHELL_DEADLINE_S = 120.0
LEAK_GRACE_S = 5.0  # what a block started may take to exit after the block itself ended

PYTHON = {"python", "py", "python3"}
SHELL = {"bash", "sh", "shell", "console"}
YAML = {"yaml", "yml"}
JSON = {"json"}

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
NOT_RUN = re.compile(r"^<!--\s*not run\s*(?::(?P<reason>.*?))?\s*-->$")
NOT_RECIPE = re.compile(r"^<!--\s*yaml:\s*not a recipe\s*(?:\((?P<reason>.*)\))?\s*-->$")
MARKER_HINT = re.compile(r"^<!--.*(not run|not a recipe)", re.IGNORECASE)


class SnippetFailed(AssertionError):
    """A block broke its rule; the message starts with `file:line`."""


class SnippetSkipped(Exception):
    """A block marked `not run`, with its reason."""


@dataclass(frozen=True)
class Block:
    """One fenced block (or, with `problem` set, a marker or fence that is wrong where it
    stands)."""

    path: Path  # relative to the root it was collected from
    line: int  # the opening fence's, 1-based
    lang: str
    code: str
    marker: str | None = None  # "not run" or "not a recipe"
    reason: str | None = None  # the marker's reason ("" when it gave none)
    problem: str | None = None

    @property
    def id(self) -> str:
        return f"{self.path.as_posix()}:{self.line}"


def markdown_files(root: Path) -> list[Path]:
    """README.md and docs/**/*.md under `root` (never the built site)."""
    found = [root / "README.md"] if (root / "README.md").is_file() else []
    docs = root / "docs"
    if docs.is_dir():
        found += sorted(p for p in docs.rglob("*.md") if "site" not in p.relative_to(root).parts)
    return found


def _marker(line: str) -> tuple[str, str] | None:
    """(kind, reason) of a marker line, ("malformed", line) for a line that looks like one but is
    not."""
    text = line.strip()
    if match := NOT_RUN.match(text):
        return "not run", (match.group("reason") or "").strip()
    if match := NOT_RECIPE.match(text):
        return "not a recipe", (match.group("reason") or "").strip()
    if MARKER_HINT.match(text):
        return "malformed", text
    return None


def blocks_of(path: Path, root: Path) -> list[Block]:
    """Every fenced block of `path`, in order, and every marker that marks no block."""
    relative = path.relative_to(root)
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    claimed: set[int] = set()  # marker lines that stand right before a fence
    number = 0
    while number < len(lines):
        opening = FENCE.match(lines[number])
        if opening is None:
            number += 1
            continue
        indent, fence = opening.group("indent"), opening.group("fence")
        info = opening.group("info").strip().lstrip("{").lstrip(".")
        lang = re.split(r"[\s{}]", info, maxsplit=1)[0].lower() if info else ""
        end = number + 1
        while end < len(lines):
            stripped = lines[end].strip()
            if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence):
                break
            end += 1
        if end == len(lines):
            found.append(Block(relative, number + 1, lang, "", problem="the fence is never closed"))
            break
        body = [
            line[len(indent) :] if line.startswith(indent) else line.lstrip()
            for line in lines[number + 1 : end]
        ]
        marker = _marker(lines[number - 1]) if number > 0 else None
        block = Block(relative, number + 1, lang, "\n".join(body) + "\n")
        if marker is not None:
            claimed.add(number - 1)
            kind, reason = marker
            if kind == "malformed":
                block = Block(
                    relative, number + 1, lang, block.code, problem=f"malformed marker {reason!r}"
                )
            else:
                block = Block(relative, number + 1, lang, block.code, kind, reason)
        found.append(block)
        number = end + 1
    for index, line in enumerate(lines):
        if index not in claimed and _marker(line) is not None and not _inside_block(index, found):
            found.append(
                Block(
                    relative,
                    index + 1,
                    "",
                    "",
                    problem=f"the marker {line.strip()!r} is not on the line right before a code "
                    f"fence",
                )
            )
    return sorted(found, key=lambda block: block.line)


def _inside_block(index: int, blocks: list[Block]) -> bool:
    """True when line `index` (0-based) lies inside a fenced block (a marker shown as an
    example)."""
    return any(
        b.line <= index < b.line + b.code.count("\n") + 1 for b in blocks if b.problem is None
    )


def collect(root: Path = REPO_ROOT) -> list[Block]:
    return [block for path in markdown_files(root) for block in blocks_of(path, root)]


# --- checking one block ------------------------------------------------------------------------

# Runs a block's command as its child subreaper: the block's orphans come back here, so the ones
# that outlive it are seen, killed and reported. argv: report path, deadline (s), grace (s),
# command...
SUPERVISOR = r"""
import ctypes, json, os, subprocess, sys, time
import psutil

report, deadline, grace, command = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
    sys.exit("cannot become a child subreaper")
me = psutil.Process()


def reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def left():
    found = []
    for child in me.children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def describe(proc):
    try:
        return {"pid": proc.pid, "cmdline": " ".join(proc.cmdline())[:300]}
    except psutil.Error:
        return {"pid": proc.pid, "cmdline": "?"}


def kill_all():
    for _ in range(20):
        procs = left()
        if not procs:
            return
        for proc in procs:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.05)
        reap()


started = time.monotonic()
block = subprocess.Popen(command)
timed_out = False
try:
    returncode = block.wait(deadline)
except subprocess.TimeoutExpired:
    timed_out = True
    kill_all()
    returncode = block.wait()
elapsed = time.monotonic() - started
reap()
until = time.monotonic() + grace
while left() and time.monotonic() < until:
    time.sleep(0.05)
    reap()
leaked = [describe(proc) for proc in left()]
kill_all()
with open(report, "w") as out:
    json.dump(
        {"returncode": returncode, "timed_out": timed_out, "leaked": leaked, "elapsed_s": elapsed},
        out,
    )
"""


def _venv_python(root: Path) -> str:
    python = root / ".venv" / "bin" / "python"
    return str(python) if python.exists() else sys.executable


def base_env(root: Path) -> dict[str, str]:
    """This environment without a launcher's rank variables, with the repo's scorer envs named."""
    drop = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "PYTHONPATH", "VIRTUAL_ENV"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["MANAGED_SCORERS_ENVS"] = str(REPO_ROOT / "envs")
    return env


def _tail(text: str, lines: int = 40) -> str:
    kept = text.rstrip().splitlines()[-lines:]
    return "\n".join(kept)


def _supervised(
    block: Block,
    command: list[str],
    cwd: Path,
    env: dict[str, str],
    deadline_s: float,
    workdir: Path,
) -> float:
    """Run `command` under the supervisor; a failure, a timeout or a leaked process fails the block.
    Returns the block's own run time."""
    report = workdir / "snippet-report.json"
    python = _venv_python(REPO_ROOT)
    argv = [python, "-c", SUPERVISOR, str(report), str(deadline_s), str(LEAK_GRACE_S), *command]
    try:
        done = subprocess.run(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=deadline_s + LEAK_GRACE_S + 30,
            start_new_session=True,  # a block's signal to its own process group stays there
        )
    except subprocess.TimeoutExpired as exc:
        raise SnippetFailed(f"{block.id}: the runner itself did not end ({exc})") from exc
    output = f"--- stdout ---\n{_tail(done.stdout)}\n--- stderr ---\n{_tail(done.stderr)}"
    if done.returncode != 0 or not report.exists():
        raise SnippetFailed(
            f"{block.id}: the snippet supervisor failed (exit {done.returncode})\n{output}"
        )
    result = json.loads(report.read_text())
    if result["timed_out"]:
        raise SnippetFailed(
            f"{block.id}: {block.lang} block ran past its {deadline_s:.0f} s deadline\n{output}"
        )
    if result["returncode"] != 0:
        raise SnippetFailed(
            f"{block.id}: {block.lang} block exited {result['returncode']}\n{output}"
        )
    if result["leaked"]:
        leaked = "; ".join(f"pid {p['pid']}: {p['cmdline']}" for p in result["leaked"])
        raise SnippetFailed(
            f"{block.id}: processes outlived the block by {LEAK_GRACE_S:.0f} s (killed): "
            f"{leaked}\n{output}"
        )
    return float(result["elapsed_s"])


def console_commands(code: str) -> str:
    """A console block's commands: its `$ ` lines (and their continuations); all of it without
    prompts."""
    lines = code.splitlines()
    if not any(line.startswith("$ ") for line in lines):
        return code
    kept: list[str] = []
    continuing = False
    for line in lines:
        if line.startswith("$ "):
            kept.append(line[2:])
        elif continuing:
            kept.append(line)
        else:
            continue
        continuing = line.rstrip().endswith("\\")
    return "\n".join(kept) + "\n"


def _untracked(root: Path) -> set[str]:
    """Untracked files in the repo root itself that git does not ignore: where a block that writes
    to its working directory leaves them (`reward.yaml`, a log). Deeper folders are left out: a file
    someone adds there while a block runs is not the block's."""
    done = subprocess.run(
        ["git", "ls-files", "--others", "--exclude-standard", "--directory", "-z"],
        cwd=root,
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        return set()
    return {
        path
        for path in done.stdout.decode(errors="replace").split("\0")
        if path and "/" not in path.rstrip("/")
    }


@contextlib.contextmanager
def _recipe_context(root: Path) -> Iterator[None]:
    """Where a trainer loads a recipe: the repo root, the repo's scorer envs."""
    saved = os.environ.get("MANAGED_SCORERS_ENVS")
    os.environ["MANAGED_SCORERS_ENVS"] = str(REPO_ROOT / "envs")
    try:
        with contextlib.chdir(root):
            yield
    finally:
        if saved is None:
            os.environ.pop("MANAGED_SCORERS_ENVS", None)
        else:
            os.environ["MANAGED_SCORERS_ENVS"] = saved


def check(
    block: Block,
    workdir: Path,
    root: Path = REPO_ROOT,
    python_deadline_s: float = PYTHON_DEADLINE_S,
) -> str:
    """Check one block by its rule: returns what was done; raises SnippetFailed or
    SnippetSkipped."""
    if block.problem is not None:
        raise SnippetFailed(f"{block.id}: {block.problem}")
    if block.marker == "not run":
        if not block.reason:
            raise SnippetFailed(
                f"{block.id}: `<!-- not run -->` needs a reason: `<!-- not run: REASON -->`"
            )
        raise SnippetSkipped(f"{block.id}: not run: {block.reason}")
    if block.marker == "not a recipe":
        if block.lang not in YAML:
            raise SnippetFailed(
                f"{block.id}: `<!-- yaml: not a recipe -->` stands before a {block.lang!r} block"
            )
        if not block.reason:
            raise SnippetFailed(
                f"{block.id}: `<!-- yaml: not a recipe -->` needs a reason in parentheses"
            )
        try:
            yaml.safe_load(block.code)
        except yaml.YAMLError as exc:
            raise SnippetFailed(f"{block.id}: YAML does not parse: {exc}") from exc
        return "parsed (not a recipe)"
    if block.lang in PYTHON:
        script = workdir / "snippet.py"
        script.write_text(block.code)
        env = base_env(root) | {"PYTHONPATH": str(root)}
        elapsed = _supervised(
            block, [_venv_python(root), str(script)], workdir, env, python_deadline_s, workdir
        )
        return f"ran in {elapsed:.1f} s"
    if block.lang in SHELL:
        code = console_commands(block.code) if block.lang == "console" else block.code
        env = base_env(root)
        env["PATH"] = f"{root / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        before = _untracked(root)
        elapsed = _supervised(
            block, ["bash", "-euo", "pipefail", "-c", code], root, env, SHELL_DEADLINE_S, workdir
        )
        left = sorted(_untracked(root) - before)
        if left:
            raise SnippetFailed(
                f"{block.id}: the block left files in the repo: {', '.join(left)} "
                "(write them under a temp dir, or remove them at the end)"
            )
        return f"ran in {elapsed:.1f} s"
    if block.lang in YAML:
        from supervisor.compose.recipes import load_recipe

        recipe = workdir / "recipe.yaml"
        recipe.write_text(block.code)
        try:
            with _recipe_context(root):
                load_recipe(recipe)
        except Exception as exc:  # noqa: BLE001 - whatever the loader raises is the block's failure
            raise SnippetFailed(
                f"{block.id}: not a recipe load_recipe accepts ({type(exc).__name__}: "
                f"{exc}); if it is not a "
                "recipe, put `<!-- yaml: not a recipe (REASON) -->` on the line before the fence"
            ) from exc
        return "loaded as a recipe"
    if block.lang in JSON:
        try:
            json.loads(block.code)
        except json.JSONDecodeError as exc:
            raise SnippetFailed(f"{block.id}: JSON does not parse: {exc}") from exc
        return "parsed"
    return "not run (" + (block.lang or "unlabelled") + ")"


def timed_check(block: Block, workdir: Path) -> tuple[str, float]:
    started = time.monotonic()
    said = check(block, workdir)
    return said, time.monotonic() - started
