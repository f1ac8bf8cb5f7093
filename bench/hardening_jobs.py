"""Scenarios of issue 37 items 2 and 9 (the job backend), measured: rows of bench.hardening.

Public API and the fake job service (tests/helpers/fake_jobs.py) only, so the same file measures an
older tree ("before", with this tree's fake copied in) and this one ("now"). A real loopback
service, a real tmpfs in a mount namespace of its own, a real RLIMIT_FSIZE; each row says what it
measured.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from supervisor import JobItemsFailed, JobRewardBackend, RewardItem, RewardRequest, ScorerError
from tests.helpers.fake_jobs import FakeJobService

ROOT = Path(__file__).resolve().parent.parent
TRAINER = sys.executable
FAST = {"poll_interval_s": 0.02, "poll_backoff_cap_s": 0.1}


def _images(*means: int) -> RewardRequest:
    return RewardRequest(
        items=[
            RewardItem(id=f"i{mean}", image=np.full((4, 5, 3), mean, dtype=np.uint8))
            for mean in means
        ]
    )


def _outcome(call: Callable[[], object]) -> tuple[str, float]:
    """What a call gave (its rewards, or each failed item's error type), and its seconds."""
    started = time.monotonic()
    try:
        got = f"rewards {call()}"
    except JobItemsFailed as exc:
        kinds = sorted({type(error).__name__ for error in exc.errors.values()})
        got = f"JobItemsFailed: {len(exc.errors)} items, {'/'.join(kinds)}"
    except ScorerError as exc:
        got = f"{type(exc).__name__}"
    return got, time.monotonic() - started


def _backend(service: FakeJobService, spool: str, **settings: object) -> JobRewardBackend:
    knobs: dict = {
        "media_type": "image",
        "spool_dir": spool,
        "request_timeout": 5.0,
        **FAST,
        **settings,
    }
    return JobRewardBackend(service.url, "t", **knobs)


def _one_id_for_all(service: FakeJobService) -> None:
    """The broken service: every enqueue answered "job-1"; a pull of it scores the last upload."""
    service.job_id = "job-1"


def one_job_id_for_every_enqueue() -> str:
    """Item 2: three images whose true means are [0, 100, 200], one job id for all three."""
    with FakeJobService("t") as service, tempfile.TemporaryDirectory() as spool:
        _one_id_for_all(service)
        with _backend(service, spool) as backend:
            got, _ = _outcome(lambda: backend.compute_rewards(_images(0, 100, 200)).rewards)
    return f"true means [0, 100, 200], the service answers job-1 to every enqueue: {got}"


def one_job_id_again_in_a_later_call() -> str:
    """Item 2: a later call's enqueue answered the job id an earlier call already took a score
    for."""
    with FakeJobService("t") as service, tempfile.TemporaryDirectory() as spool:
        _one_id_for_all(service)
        with _backend(service, spool) as backend:
            first, _ = _outcome(lambda: backend.compute_rewards(_images(0)).rewards)
            second, _ = _outcome(lambda: backend.compute_rewards(_images(200)).rewards)
    return f"call 1 (mean 0): {first}; call 2 (mean 200) gets job-1 again: {second}"


def _spool_fault(media_type: str, tmpfs: bool, limit_kib: int) -> str:
    with tempfile.TemporaryDirectory() as spool:
        command = [
            TRAINER,
            "-m",
            "tests.helpers.jobs_spool_fault",
            spool,
            media_type,
            str(limit_kib),
        ]
        if tmpfs:
            mount = 'mount -t tmpfs -o size=64k tmpfs "$0" && exec "$@"'
            command = [
                "unshare",
                "--user",
                "--map-root-user",
                "--mount",
                "sh",
                "-c",
                mount,
                spool,
                *command,
            ]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-2000:])
    got = json.loads(done.stdout.splitlines()[-1])
    message = got["message"]
    names = [
        what
        for what, there in (("item", "'big'" in message), ("spool file", got["spool"] in message))
        if there
    ]
    return (
        f"{got['raised']} (errno {got['errno']}), names: "
        f"{', '.join(names) or 'neither item nor spool'}"
    )


def spool_on_a_full_disk() -> str:
    """Item 9: a 144 KiB video spooled on a 64 KiB tmpfs (a mount namespace of its own)."""
    return f"144 KiB video, 64 KiB tmpfs spool: {_spool_fault('video', True, 0)}"


def spool_past_a_file_size_limit() -> str:
    """Item 9: a 192 KiB image spooled under RLIMIT_FSIZE 64 KiB, SIGXFSZ ignored."""
    return f"192 KiB image, RLIMIT_FSIZE 64 KiB: {_spool_fault('image', False, 64)}"


def enqueue_answered_429() -> str:
    """Item 9: the first two enqueues answered 429 with Retry-After: 0.5 (backoff cap 0.1 s)."""
    with FakeJobService("t") as service, tempfile.TemporaryDirectory() as spool:
        service.on_enqueue = lambda upload: (
            (429, "busy", {"retry-after": "0.5"}) if service.enqueues <= 2 else None
        )
        with _backend(service, spool) as backend:
            got, seconds = _outcome(lambda: backend.compute_rewards(_images(100)).rewards)
        gaps = np.diff([upload.at for upload in service.uploads])
    waited = f", gaps {', '.join(f'{gap:.2f}' for gap in gaps)} s" if len(gaps) else ""
    return f"{got} after {seconds:.2f} s, {service.enqueues} enqueues{waited}"


def pull_with_retry_after() -> str:
    """Item 9: the first pull answered 503 with Retry-After: 0.5 (backoff 0.02 s, cap 0.1 s)."""
    with FakeJobService("t") as service, tempfile.TemporaryDirectory() as spool:
        service.on_pull = lambda job_id, n: (
            (503, "later", {"retry-after": "0.5"}) if n == 1 else None
        )
        with _backend(service, spool) as backend:
            got, _ = _outcome(lambda: backend.compute_rewards(_images(100)).rewards)
        pulls = [pull.at for pull in service.pulls]
    return f"{got}; second pull {pulls[1] - pulls[0]:.2f} s after the first"


def pull_retry_after_past_the_deadline() -> str:
    """Item 9: every pull pending with Retry-After: 60, request_timeout 2 s."""
    with FakeJobService("t") as service, tempfile.TemporaryDirectory() as spool:
        service.on_pull = lambda job_id, n: (
            202,
            {"uuid": job_id, "status": "pending"},
            {"retry-after": "60"},
        )
        with _backend(service, spool, request_timeout=2.0) as backend:
            got, seconds = _outcome(lambda: backend.compute_rewards(_images(100)).rewards)
    return f"{got} after {seconds:.2f} s, {len(service.pulls)} pulls"


SCENARIOS = [
    ("jobs: one job id for every enqueue (item 2)", one_job_id_for_every_enqueue),
    ("jobs: a later call gets a consumed job id (item 2)", one_job_id_again_in_a_later_call),
    ("jobs: spool on a full disk (item 9)", spool_on_a_full_disk),
    ("jobs: spool past RLIMIT_FSIZE (item 9)", spool_past_a_file_size_limit),
    ("jobs: enqueue answered 429 + Retry-After (item 9)", enqueue_answered_429),
    ("jobs: pull answered 503 + Retry-After (item 9)", pull_with_retry_after),
    ("jobs: pull's Retry-After past the deadline (item 9)", pull_retry_after_past_the_deadline),
]
