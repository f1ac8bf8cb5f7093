"""`make demo`'s command from a checkout: the math child grades `10\\%` right, and the trainer env's
own grader (hydra-core 1.3.2's antlr 4.9.3, as in `.venv-demo`) grades it wrong, measured in the
same run. The installed use (`managed-scorers demo` from a wheel) is tested in test_installed.py, on
its venv."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT, env_python, launcher_free_env


def rows(stdout: str) -> dict[str, list[str]]:
    """The demo's table: id -> its cells after the completion (gold, managed, in-process, flag
    words)."""
    found = {}
    for line in stdout.splitlines():
        words = line.split()
        if (
            line.startswith("  ")
            and words
            and words[0] in ("pct", "boxed", "frac", "wrong", "junk", "tower")
        ):
            found[words[0]] = words
    return found


@pytest.mark.slow
def test_make_demos_command_shows_the_in_process_grader_wrong_and_the_child_right(tmp_path):
    # the dev env holds hydra's pin too
    assert importlib.metadata.version("antlr4-python3-runtime") == "4.9.3"
    env_python("math")  # built by make test (make demo builds it the same way)
    done = subprocess.run(
        # what `make demo` runs, but in .venv
        [sys.executable, "-m", "supervisor", "demo", "--no-build"],
        cwd=REPO_ROOT,
        env=launcher_free_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    table = rows(done.stdout)
    assert set(table) == {"pct", "boxed", "frac", "wrong", "junk"}  # the hostile item is the tour's
    assert table["pct"][-6:] == ["0.1", "1.0", "0.0", "<-", "wrong", "in-process"]
    for name, verdict in (("boxed", "1.0"), ("frac", "1.0"), ("wrong", "0.0"), ("junk", "0.0")):
        assert table[name][-2:] == [verdict, verdict], table[name]  # managed and in-process agree
    assert "antlr4-python3-runtime 4.13.2" in done.stdout  # the child's
    # the trainer's
    assert "antlr4-python3-runtime 4.9.3, pinned by hydra-core 1.3.2" in done.stdout
    assert "`pct` (a correct 10% for 0.1) got 0.0, with no error" in done.stdout
    assert "first managed reward" in done.stdout


def test_demo_without_an_env_names_the_command_that_builds_it(tmp_path):
    """`--no-build` where the math env is missing: one line with the command, exit 2, nothing
    built."""
    done = subprocess.run(
        [sys.executable, "-m", "supervisor", "demo", "--no-build"],
        cwd=tmp_path,
        env=launcher_free_env(MANAGED_SCORERS_ENVS=str(tmp_path / "envs")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        f"managed-scorers demo: scorer env(s) math not built under {tmp_path / 'envs'}: "
        "run `managed-scorers envs build math`"
    ]
    assert not (tmp_path / "envs").exists()
