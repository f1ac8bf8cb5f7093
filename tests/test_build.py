"""The env builder fails loudly: a failed install never writes the up-to-date stamp."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT


@pytest.mark.slow
def test_a_failed_install_fails_the_build_and_writes_no_stamp(tmp_path):
    envs = tmp_path / "envs"
    (envs / "broken").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "envs" / "build.sh", envs / "build.sh")
    (envs / "broken" / "requirements.txt").write_text("managed-scorers-no-such-package==0.0.1\n")
    done = subprocess.run(
        [str(envs / "build.sh"), "broken", sys.executable], capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0, done.stdout
    assert "managed-scorers-no-such-package" in done.stdout + done.stderr
    assert not (envs / "broken" / ".venv" / ".requirements.sha256").exists()
