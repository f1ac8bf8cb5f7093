"""The job backend's spool on a full disk (a 64 KiB tmpfs in a mount namespace of its own) and
under a file-size limit (RLIMIT_FSIZE with SIGXFSZ ignored): real ENOSPC and EFBIG from the
kernel, in a subprocess, so that neither the mount nor the limit touches the test run."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

SPOOL_KIB = 64


def run_spooling(spool_dir: Path, media_type: str, *, tmpfs: bool, limit_kib: int = 0) -> dict:
    command = [
        sys.executable,
        "-m",
        "tests.helpers.jobs_spool_fault",
        str(spool_dir),
        media_type,
        str(limit_kib),
    ]
    if tmpfs:  # a user and mount namespace of its own: the tmpfs is gone with the process
        mount = f'mount -t tmpfs -o size={SPOOL_KIB}k tmpfs "$0" && exec "$@"'
        command = [
            "unshare",
            "--user",
            "--map-root-user",
            "--mount",
            "sh",
            "-c",
            mount,
            str(spool_dir),
            *command,
        ]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    ("media_type", "fault"),
    [("video", "ENOSPC"), ("image", "EFBIG")],
    ids=["video-on-a-full-disk", "image-past-RLIMIT_FSIZE"],
)
def test_a_spool_that_cannot_take_the_payload_is_a_typed_error_naming_the_file_and_the_item(
    tmp_path, media_type, fault
):
    """Issue 37 item 9: a bare OSError (ENOSPC / EFBIG) named neither the spool nor the item."""
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    got = run_spooling(
        spool_dir,
        media_type,
        tmpfs=fault == "ENOSPC",
        limit_kib=SPOOL_KIB if fault == "EFBIG" else 0,
    )
    assert got["raised"] == "JobSpoolFailed", got
    assert got["errno"] == getattr(errno, fault) and fault in got["message"]
    assert got["spool_path"].startswith(got["spool"] + "/") and got["spool_path"] in got["message"]
    assert (
        "'big'" in got["message"] and "nothing was sent" in got["message"] and not got["orphaned"]
    )
    assert got["enqueues"] == 0 and got["left"] == []  # nothing sent, the partial file removed
    assert list(spool_dir.iterdir()) == []  # the spool directory went with close()
