"""Torch CPU tensors are accepted wherever numpy arrays are (images, videos, DDPO batches), without
a copy.

The trainer env of the suite (.venv) has no torch; the checks run in envs/trl, which has it
(tests/helpers/torch_inputs.py lists them), including a managed image child fed from tensors.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import REPO_ROOT, env_python

EXPECTED = {
    "float zero_one NCHW tensor == array",
    "float neg_one_to_one NHWC tensor == array",
    "uint8 NHWC tensor passes unchanged",
    "bfloat16 images are quantised like their float32 values",
    "the on-device transform == the numpy one, zero_one NCHW",
    "the on-device transform == the numpy one, neg_one_to_one NHWC",
    "a bfloat16 item image is refused",
    "an item's tensor image is a view, not a copy",
    "an item's tensor video is a view",
    "condition images take tensors",
    "DDPO managed child: tensor == in-process array",
    "DDPO managed child: built in the arena, sent in place",
}


@pytest.mark.slow
def test_torch_tensors_go_wherever_arrays_go(tmp_path):
    done = subprocess.run(
        [
            str(env_python("trl")),
            str(REPO_ROOT / "tests" / "helpers" / "torch_inputs.py"),
            str(env_python("image")),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    passed = set(json.loads(done.stdout.splitlines()[-1]))
    assert EXPECTED <= passed, EXPECTED - passed
