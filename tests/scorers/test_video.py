"""The video wrapper: frames sampled, scored by the inner image scorer, reduced per clip."""

from __future__ import annotations

import numpy as np
import pytest

from scorers.builtin.video import VideoScorer, frame_indices
from supervisor import LocalRewardBackend, RewardItem, RewardRequest


def clip(seed: int, frames: int = 6, size: int = 48) -> np.ndarray:
    rng = np.random.default_rng(seed)
    noise = rng.integers(0, 256, (frames, size, size, 3), dtype=np.uint8)
    ramp = np.linspace(0.0, 1.0, frames)[:, None, None, None]
    return (noise * ramp).astype(np.uint8)  # frames get noisier: distinct jpeg sizes


def frame_rewards(video: np.ndarray, indices: list[int]) -> list[float]:
    with LocalRewardBackend("jpeg_compressibility") as images:
        items = [RewardItem(id=f"f{t}", image=video[t]) for t in indices]
        return images.compute_rewards(RewardRequest(items=items)).rewards


@pytest.mark.parametrize(
    "n,frames,stride,expected",
    [
        (10, 4, None, [0, 3, 6, 9]),
        (10, None, 3, [0, 3, 6, 9]),
        (3, 8, None, [0, 1, 2]),
        (1, 8, None, [0]),
        (5, 1, None, [0]),
        (7, None, 10, [0]),
    ],
)
def test_frame_indices(n, frames, stride, expected):
    assert frame_indices(n, frames, stride) == expected


@pytest.mark.parametrize("reduce,fn", [("mean", np.mean), ("min", np.min), ("max", np.max)])
def test_video_reward_is_the_reduction_of_its_frame_rewards(reduce, fn):
    videos = [clip(1), clip(2, frames=4)]
    params = {"inner": "jpeg_compressibility", "frames": 3, "reduce": reduce}
    with LocalRewardBackend("video", params=params) as backend:
        response = backend.compute_rewards(
            RewardRequest(items=[RewardItem(id=f"v{i}", video=v) for i, v in enumerate(videos)])
        )
    for value, video in zip(response.rewards, videos, strict=True):
        expected = fn(frame_rewards(video, frame_indices(video.shape[0], 3, None)))
        assert value == pytest.approx(expected, rel=1e-12)
    assert response.diagnostics == {"video": {"sample_count": 2, "values": {"frames_scored": 6}}}


def test_video_in_a_managed_child_matches_in_process(managed, image_python):
    request = RewardRequest(items=[RewardItem(id="v", video=clip(3, frames=5))])
    params = {"inner": "jpeg_compressibility", "stride": 2}
    backend = managed(image_python, "video", input_kind="video", params=params)
    with LocalRewardBackend("video", params=params) as local:
        assert backend.compute_rewards(request).rewards == local.compute_rewards(request).rewards
    assert backend.compute_rewards(request).rewards[0] == pytest.approx(
        np.mean(frame_rewards(request.items[0].video, [0, 2, 4])), rel=1e-12
    )


@pytest.mark.parametrize(
    "params,message",
    [
        ({"inner": "jpeg_compressibility", "frames": 2, "stride": 2}, "not both"),
        ({"inner": "jpeg_compressibility", "frames": 0}, "positive int"),
        ({"inner": "jpeg_compressibility", "reduce": "median"}, "reduce must be one of"),
        ({"inner": "exact_match"}, "takes 'text', not 'image'"),
    ],
)
def test_bad_video_params(params, message):
    with pytest.raises(ValueError, match=message):
        VideoScorer(**params)


def test_video_spec_follows_the_inner_scorer():
    scorer = VideoScorer(inner="jpeg_incompressibility")
    assert scorer.spec.input_kind == "video" and scorer.spec.env == "image"
    assert scorer.spec.required_fields == ("video",) and scorer.spec.term_names() == ("video",)
    assert scorer.spec.revision == "video[jpeg_incompressibility@ddpo-q95]"


def test_a_multi_term_inner_scorer_is_refused():
    with pytest.raises(ValueError, match="wrap a single-term scorer"):
        VideoScorer(inner="tests.helpers.fixture_scorers:TwoTermImage")
