"""The UniRL route's `video_b64` decoder against hostile clips, in the image env (PyAV): a clip of
more than MAX_FRAMES tiny frames (a byte budget alone let 200,000 through) and an FFmpeg concat
list naming a file of the server's (any demuxer but mp4's would read it) are refused; a plain
clip decodes, charged frame by frame."""

from __future__ import annotations

import json
import subprocess

from tests.conftest import REPO_ROOT, env_python


def test_hostile_clips_are_refused_and_a_plain_one_decodes(tmp_path):
    done = subprocess.run(
        [str(env_python("image")), "-m", "tests.helpers.unirl_video_cases", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    cases = json.loads(done.stdout.splitlines()[-1])
    assert cases["plain"] == "decoded [4, 16, 16, 3], charged 3072"
    assert cases["too many frames"] == "refused: turn holds more than 1024 frames"
    assert cases["a concat list of a server file"].startswith("refused: turn is not a readable mp4")
