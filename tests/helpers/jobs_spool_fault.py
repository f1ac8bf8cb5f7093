"""`python -m tests.helpers.jobs_spool_fault SPOOL_DIR MEDIA_TYPE LIMIT_KIB`: one item larger than
the spool can hold, sent to a fake job service through a JobRewardBackend spooling under SPOOL_DIR;
prints what the call raised as one JSON line. With LIMIT_KIB > 0 the process's RLIMIT_FSIZE is that
(and SIGXFSZ ignored, so a write past it fails EFBIG instead of killing the process); run it on a
tiny tmpfs for ENOSPC. A script of its own so that neither the limit nor the mount touches its
caller."""

from __future__ import annotations

import json
import resource
import signal
import sys

import numpy as np

from supervisor import JobItemsFailed, JobRewardBackend, RewardItem, RewardRequest
from tests.helpers.fake_jobs import FakeJobService


def main(spool_dir: str, media_type: str, limit_kib: int) -> dict:
    if limit_kib:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(
            resource.RLIMIT_FSIZE, (limit_kib * 1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1])
        )
    # 144 or 192 KiB. The video goes as a transposed view, the image as it is: numpy writes the two
    # differently (in chunks, or whole).
    shape = (12, 64, 64, 3) if media_type == "video" else (256, 256, 3)
    item = RewardItem(id="big", **{media_type: np.full(shape, 7, np.uint8)})
    fps = {"fps": 8.0} if media_type == "video" else {}
    with FakeJobService("t") as service:
        with JobRewardBackend(
            service.url, "t", media_type=media_type, spool_dir=spool_dir, **fps
        ) as backend:
            try:
                backend.compute_rewards(RewardRequest(items=[item]))
                got: dict = {"raised": None}
            except JobItemsFailed as exc:
                error = exc.errors["big"]
                got = {
                    "raised": type(error).__name__,
                    "message": str(error),
                    "orphaned": error.orphaned,
                }
                got |= {
                    "errno": getattr(error, "errno", None),
                    "spool_path": getattr(error, "spool_path", None),
                }
            except Exception as exc:  # noqa: BLE001 - what escaped untyped is the finding
                got = {
                    "raised": type(exc).__name__,
                    "message": str(exc),
                    "errno": getattr(exc, "errno", None),
                }
            got |= {
                "enqueues": service.enqueues,
                "left": backend.spool.files(),
                "spool": backend.spool.dir,
            }
    return got


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
