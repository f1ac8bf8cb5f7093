"""`serve --unirl-secret-file`: UniRL 0.2.0's own `RemoteRewardBackend` and `RewardService`,
unchanged (no header, its identity echo and version pin on), at `base_url: .../unirl/<secret>`.

Two servers, started together: a three-term image scorer (tests/helpers/fixture_scorers.GreyLevels)
and `video` over mean_intensity in the image env (PyAV decodes UniRL's mp4s there). UniRL's client
runs in envs/trl (tests/helpers/unirl_remote_client.py, one process); every reward it returns is
checked here against UniRL's rules (reduce each reward's sub-metrics, then aggregate with the
weights) computed by hand from the grey levels.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import REPO_ROOT, env_python, wait_until_gone
from tests.ops.test_cli_serve import FLAKY, run_serve_args, start_serve, stop_serve, wait_ready

LEVELS = [0, 51, 102, 255]
REQUIRED = ["grey_levels", "dark", "half"]
WEIGHTS = {"grey_levels": 2.0, "dark": 0.5}  # half: UniRL's default weight, 1.0
IMAGE = ["--scorer", "tests.helpers.fixture_scorers:GreyLevels", "--python", sys.executable]
IMAGE += ["--extra-import-path", str(REPO_ROOT)]
VIDEO = ["--scorer", "video", "--env", "image", "--params", '{"inner": "mean_intensity"}']


def reduced(level: int, reduce: str) -> dict[str, float]:
    """Each required reward's score for one image, by UniRL's `sub_metric_reduce`: grey_levels'
    sub-metrics are its reward (half) then its other terms, in that order."""
    v = level / 255
    grey = [v / 2, v, 1 - v]
    pick = {"first": grey[0], "mean": sum(grey) / 3, "max": max(grey)}[reduce]
    return {"grey_levels": pick, "dark": 1 - v, "half": v / 2}


def aggregated(scores: dict[str, float], method: str) -> float:
    values = [scores[name] for name in REQUIRED]
    weights = [WEIGHTS.get(name, 1.0) for name in REQUIRED]
    if method == "weighted_sum":
        return sum(s * w for s, w in zip(values, weights, strict=True)) / sum(weights)
    return {"mean": statistics.fmean, "min": min, "max": max}[method](values)


def items_scored(url: str, token: str) -> float:
    page = httpx.get(f"{url}/metrics", headers={"authorization": f"Bearer {token}"}, timeout=10)
    lines = [
        line for line in page.text.splitlines() if line.startswith("managed_scorers_child_items")
    ]
    return sum(float(line.split()[-1]) for line in lines if "_total{" in line)


@pytest.mark.slow
def test_unirls_own_remote_client_scores_images_and_video_on_the_secret_path(tmp_path: Path):
    servers, ready = [], {}
    for name, args in (("image", IMAGE), ("video", VIDEO)):
        secret = tmp_path / f"{name}-secret"
        flags = [
            "--token-file",
            str(tmp_path / f"{name}-token"),
            "--unirl-secret-file",
            str(secret),
        ]
        server, ready[name], _ = start_serve(tmp_path, name, *args, *flags)
        servers.append(server)
    pids = [server.pid for server in servers]
    try:
        info = {name: wait_ready(path, 90) for name, path in ready.items()}
        assert info["image"]["unirl_route"] is True
        base = {
            name: f"http://127.0.0.1:{info[name]['port']}/unirl/"
            + (tmp_path / f"{name}-secret").read_text().strip()
            for name in info
        }
        token = (tmp_path / "image-token").read_text().strip()
        args = {
            "image_url": base["image"],
            "video_url": base["video"],
            "image_identity": info["image"]["identity_hash"],
            "video_identity": info["video"]["identity_hash"],
            "levels": LEVELS,
            "weights": WEIGHTS,
            "required": REQUIRED,
        }
        done = subprocess.run(
            [str(env_python("trl")), "-m", "tests.helpers.unirl_remote_client", json.dumps(args)],
            cwd=REPO_ROOT,
            env={**os.environ, "RANK": "3"},  # echoed as source_rank
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        report = json.loads(done.stdout.splitlines()[-1])
        check_report(report, info["image"]["identity_hash"])
        scored = items_scored(f"http://127.0.0.1:{info['image']['port']}", token)
        # 12 runs and the service's Sample, 4 images each: the refused calls scored nothing
        assert scored == 13 * len(LEVELS)
        for name, log in (("image", "image.log"), ("video", "video.log")):
            said = (tmp_path / log).read_text()
            assert base[name].rsplit("/", 1)[1] not in said  # the access log leaves it out
        assert "401 for 1 request(s) to /unirl/<secret>" in (tmp_path / "image.log").read_text()
        pids += [c.pid for s in servers for c in psutil.Process(s.pid).children(recursive=True)]
    finally:
        codes = [stop_serve(server) for server in servers]
    assert codes == [0, 0]
    assert wait_until_gone(pids, 10) == []


def check_report(report: dict, identity: str) -> None:
    assert report["health"] == {
        "status": "ok",
        "rewards": {
            "grey_levels": ["grey_levels", "bright", "dark"],
            "half": ["half"],
            "bright": ["bright"],
            "dark": ["dark"],
        },
        "scorer_version": identity,
    }
    assert report["available"] == [True] * 12
    for run in report["runs"]:
        scores = [reduced(level, run["reduce"]) for level in LEVELS]
        expected = [aggregated(s, run["method"]) for s in scores]
        assert run["rewards"] == pytest.approx(expected, rel=1e-12, abs=1e-15), run
        assert run["components"] == {
            name: pytest.approx([s[name] for s in scores], rel=1e-12, abs=1e-15)
            for name in REQUIRED
        }
        assert run["successes"] == [True] * 4 and run["errors"] == [None] * 4
    first = [aggregated(reduced(level, "first"), "weighted_sum") for level in LEVELS]
    assert report["service"] == pytest.approx(first, rel=1e-6)  # float32, as UniRL attaches them
    assert "not served by" in report["missing"] and "grey_levels" in report["missing"]
    assert report["wrong_secret_available"] is False
    assert report["wrong_secret"] == [
        401,
        {"error": "missing or wrong secret in the path", "kind": "unauthorized"},
    ]
    status, body = report["other_version"]
    assert status == 409 and body["kind"] == "identity_mismatch" and identity in body["error"]
    assert report["video_available"] is True
    clips = [[0.2, 0.4, 0.8], [1.0, 0.0, 0.6]]
    # frames quantised by UniRL (x 255, truncated), then H.264 at fps 8: within a level of each
    expected = [statistics.fmean(int(v * 255) / 255 for v in clip) for clip in clips]
    assert report["video"]["rewards"] == pytest.approx(expected, abs=1.01 / 255)
    assert report["video"]["successes"] == [True, True]


def test_serve_refuses_a_unirl_secret_shared_with_another_and_a_scorer_unirl_cannot_feed(
    tmp_path: Path,
):
    same = tmp_path / "same"
    same.write_text("s" * 32 + "\n")
    same.chmod(0o600)
    for other in ("--token-file", "--openrlhf-secret-file", "--metrics-token-file"):
        shared = run_serve_args(*FLAKY, other, str(same), "--unirl-secret-file", str(same))
        assert shared.returncode == 2 and "the UniRL secret must differ from the" in shared.stderr
        assert len(shared.stderr.strip().splitlines()) == 1  # one line, no traceback
    # FLAKY is a text scorer: UniRL's client never sends text
    booted = run_serve_args(*FLAKY, "--unirl-secret-file", str(tmp_path / "unirl-secret"))
    said = json.loads(booted.stdout.splitlines()[0])
    assert booted.returncode == 3 and said["ready"] is False
    assert "UniRL's RemoteRewardBackend sends images and videos only" in said["error"]
    assert oct((tmp_path / "unirl-secret").stat().st_mode & 0o777) == "0o600"  # made, 0600


@pytest.mark.parametrize(
    "path", ["/unirl/S3CRET/score", "//unirl/S3CRET/score", "/Unirl/S3CRET/score", "/unirl//S3CRET"]
)
def test_the_access_log_masks_the_secret_however_the_route_is_spelled(path):
    from child_runtime.access_log import _shown_path

    shown = _shown_path(path)
    assert "S3CRET" not in shown and shown.startswith("/unirl/<secret>"), shown
