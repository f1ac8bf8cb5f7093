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
# Runs the fake service and the backend in one process; prints what compute_rewards raised.
SCRIPT = """
import json, os, resource, signal, sys
import numpy as np
from supervisor import JobItemsFailed, JobRewardBackend, RewardItem, RewardRequest
from tests.helpers.fake_jobs import FakeJobService

spool_dir, media_type, limit_kib = sys.argv[1], sys.argv[2], int(sys.argv[3])
if limit_kib:  # EFBIG for a write past the limit, not the SIGXFSZ that would kill the process
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_kib * 1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
# More than the disk or the limit holds. The video goes as a transposed view, the image as it is:
# numpy writes the two differently (in chunks, or whole).
shape = (12, 64, 64, 3) if media_type == "video" else (256, 256, 3)
item = RewardItem(id="big", **{media_type: np.full(shape, 7, np.uint8)})
with FakeJobService("t") as service:
    fps = {"fps": 8.0} if media_type == "video" else {}
    with JobRewardBackend(service.url, "t", media_type=media_type, spool_dir=spool_dir, **fps) as backend:
        try:
            backend.compute_rewards(RewardRequest(items=[item]))
            got = {"raised": None}
        except JobItemsFailed as exc:
            error = exc.errors["big"]
            got = {"raised": type(error).__name__, "message": str(error), "errno": getattr(error, "errno", None),
                   "spool_path": getattr(error, "spool_path", None), "orphaned": error.orphaned}
        except Exception as exc:
            got = {"raised": type(exc).__name__, "message": str(exc), "errno": getattr(exc, "errno", None)}
        got |= {"enqueues": service.enqueues, "left": backend.spool.files(), "spool": backend.spool.dir}
print(json.dumps(got))
"""


def run_spooling(spool_dir: Path, media_type: str, *, tmpfs: bool, limit_kib: int = 0) -> dict:
    command = [sys.executable, "-c", SCRIPT, str(spool_dir), media_type, str(limit_kib)]
    if tmpfs:  # a user and mount namespace of its own: the tmpfs is gone with the process
        mount = f'mount -t tmpfs -o size={SPOOL_KIB}k tmpfs "$0" && exec "$@"'
        command = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", mount, str(spool_dir), *command]
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
    got = run_spooling(spool_dir, media_type, tmpfs=fault == "ENOSPC", limit_kib=SPOOL_KIB if fault == "EFBIG" else 0)
    assert got["raised"] == "JobSpoolFailed", got
    assert got["errno"] == getattr(errno, fault) and fault in got["message"]
    assert got["spool_path"].startswith(got["spool"] + "/") and got["spool_path"] in got["message"]
    assert "'big'" in got["message"] and "nothing was sent" in got["message"] and not got["orphaned"]
    assert got["enqueues"] == 0 and got["left"] == []  # nothing sent, the partial file removed
    assert list(spool_dir.iterdir()) == []  # the spool directory went with close()
