"""audio_loudness: RMS loudness in dBFS against a target, checked by hand, in-process and in a
managed child from env `image` (numpy only)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scorers.builtin.audio import AudioLoudness
from supervisor import LocalRewardBackend, RewardItem, RewardRequest

RATE = 16000


def tones() -> tuple[RewardRequest, list[float]]:
    """Four waveforms and their loudness by hand (target -20 dBFS, floor -100)."""
    t = np.arange(1600) / RATE  # 0.1 s: exactly 100 periods of 1 kHz, so the mean of sin^2 is 1/2
    sine = (0.5 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32)
    waves = {
        "half": np.full((2, 800), 0.5, np.float32),  # 20 log10(0.5) = -6.02 dBFS
        # RMS 0.5 / sqrt(2): -9.03 dBFS, whatever the channel's sign
        "sine": np.stack([sine, -sine, sine]),
        "silence": np.zeros((1, 10), np.float32),  # no power: the floor, -100
        "target": np.full((1, 5), 0.1, np.float32),  # -20 dBFS: the target
    }
    levels = [20 * math.log10(0.5), 20 * math.log10(0.5 / math.sqrt(2)), -100.0, -20.0]
    items = [
        RewardItem(id=name, audio=wave, audio_sample_rate=RATE) for name, wave in waves.items()
    ]
    return RewardRequest(items=items), [-abs(level + 20.0) for level in levels]


def test_loudness_by_hand_in_process():
    request, expected = tones()
    with LocalRewardBackend("audio_loudness") as local:
        response = local.compute_rewards(request)
    assert response.rewards == pytest.approx(expected, abs=1e-5)
    assert response.rewards[2] == -80.0  # silence sits on the floor exactly
    assert response.metrics()["train/reward/audio_loudness/mean_dbfs"] == pytest.approx(
        (20 * math.log10(0.5) + 20 * math.log10(0.5 / math.sqrt(2)) - 100 - 20) / 4, abs=1e-5
    )


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"target_dbfs": float("nan")}, "finite"),
        ({"target_dbfs": -50, "floor_dbfs": -40}, "below"),
        ({"floor_dbfs": True}, "finite"),
    ],
)
def test_bad_params_are_refused_at_construction(params, match):
    with pytest.raises(ValueError, match=match):
        AudioLoudness(**params)


@pytest.mark.slow
def test_loudness_in_a_managed_child_of_env_image_equals_in_process(managed, image_python):
    request, expected = tones()
    backend = managed(image_python, "audio_loudness", "audio", params={"target_dbfs": -20.0})
    assert backend.ready_info["input_kind"] == "audio" and backend.shape.required_fields == (
        "audio",
    )
    managed_rewards = backend.compute_rewards(request).rewards
    with LocalRewardBackend("audio_loudness") as local:
        # the same float64 arithmetic
        assert managed_rewards == local.compute_rewards(request).rewards
    assert managed_rewards == pytest.approx(expected, abs=1e-5)
