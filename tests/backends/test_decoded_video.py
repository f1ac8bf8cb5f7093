"""Posttrain's decoder-attested video adapter in front of the job backend, against the fake job
service on a real socket: what the service receives (the fp32 clamp-then-scale uint8 video), the
rewards by hand, and each refusal (typed, before anything is uploaded)."""

from __future__ import annotations

import numpy as np
import pytest

from supervisor import GroupsIncomplete, GroupSizeConflict, PanelTerm, RewardPanel
from supervisor.adapters.decoded_video import (
    DecodedVideoNotFinite,
    DecodedVideoOutOfRange,
    DecodedVideoRewards,
    DecodedVideoShape,
    DecoderNotAttested,
    to_uint8_video,
)

pytestmark = pytest.mark.usefixtures("no_thread_left")


class Decoder:
    """A model-owned decoder as WFM injects it: here the identity, attested [-1, 1]."""

    output_range = "neg_one_to_one"

    def __call__(self, latent: np.ndarray) -> np.ndarray:
        return latent


def latent(*channels: float, frames: int = 2) -> np.ndarray:
    """A [1,3,T,H,W] float32 result whose channel c holds `channels[c]` everywhere."""
    values = np.asarray(channels, dtype=np.float32).reshape(1, 3, 1, 1, 1)
    return np.broadcast_to(values, (1, 3, frames, 4, 5)).copy()


def test_decoded_videos_reach_the_service_as_uint8_and_score_as_by_hand(service, backend):
    adapter = DecodedVideoRewards(
        RewardPanel([PanelTerm("video", backend)], group_size=2), Decoder()
    )
    # 1.004 overshoots by less than the tolerance: clamped to 255; 0.6 -> rint(1.6 * 127.5) = 204
    response = adapter.compute_rewards(
        [latent(1.004, -1.0, 0.6), latent(-0.2, -0.2, -0.2)], ["t0", "t1"], ["g", "g"]
    )
    assert response.rewards == [(255 + 0 + 204) / 3, 102.0]  # the fake scores the array's mean
    (first,) = [u for u in service.uploads if u.array[0, 0].min() == 255]
    assert first.array.shape == (1, 3, 2, 4, 5)
    assert first.array.dtype == np.uint8 and first.fields["media_type"] == b"video"
    assert [int(first.array[0, c].min()) for c in range(3)] == [255, 0, 204]
    assert first.fields["video_infos"] == b'{"fps": 16.0}'


def test_the_transform_is_the_fp32_clamp_then_scale_by_hand():
    """rint((clamp(x, -1, 1) + 1) * 127.5) in fp32, to THWC uint8; a bf16-like input is exact."""
    points = [-1.005, -1.0, -0.2, 0.0, 0.6, 1.0, 1.005]  # +-1.005: within the tolerance
    values = np.resize(np.asarray(points, dtype=np.float32), 3 * 7).reshape(1, 3, 1, 1, 7)
    got = to_uint8_video(values)
    assert got.shape == (1, 1, 7, 3) and got.dtype == np.uint8  # THWC, as RewardItem.video
    assert got[0, 0, :, 0].tolist() == [0, 0, 102, 128, 204, 255, 255]  # rint(127.5) = 128
    assert to_uint8_video(values.astype(np.float64)).tolist() == got.tolist()


class Unattested:
    def __call__(self, latent):
        return latent


class ZeroToOne(Decoder):
    output_range = "zero_to_one"


@pytest.mark.parametrize("decoder", [Unattested(), ZeroToOne()])
def test_an_unattested_decoder_is_refused(backend, decoder):
    with pytest.raises(DecoderNotAttested, match="must attest output_range='neg_one_to_one'"):
        DecodedVideoRewards(backend, decoder)


@pytest.mark.parametrize(
    ("result", "error", "message"),
    [
        (latent(0.0, np.nan, 0.0), DecodedVideoNotFinite, "NaN/inf values"),
        (latent(0.0, np.inf, 0.0), DecodedVideoNotFinite, "NaN/inf values"),
        (latent(1.5, 0.0, 0.0), DecodedVideoOutOfRange, r"spans \[0, 1.5\], outside \[-1, 1\]"),
        (latent(0.0, 0.0, 0.0)[0], DecodedVideoShape, r"shape \[3, 2, 4, 5\], expected one"),
        (np.zeros((1, 4, 2, 4, 5), np.float32), DecodedVideoShape, r"shape \[1, 4, 2, 4, 5\]"),
        (np.zeros((1, 3, 2, 4, 5), np.uint8), DecodedVideoShape, "returned uint8, not floats"),
    ],
)
def test_a_bad_decoded_result_is_refused_before_anything_is_sent(
    service, backend, result, error, message
):
    adapter = DecodedVideoRewards(backend, lambda_decoder(result))
    with pytest.raises(error, match=message) as info:
        adapter.compute_rewards([None], ["t0"])
    assert "trajectory 't0'" in str(info.value) and info.value.kind == "bad_input"
    assert service.enqueues == 0


def lambda_decoder(result: np.ndarray) -> Decoder:
    class Fixed(Decoder):
        def __call__(self, latent):
            return result

    return Fixed()


def test_group_rules_hold_in_front_of_the_job_backend(service, backend):
    """An incomplete group of the declared size, and a request overriding the panel's size: both
    refused, naming what to fix, before any upload."""
    adapter = DecodedVideoRewards(backend, Decoder())
    videos = [latent(0.0, 0.0, 0.0)] * 3
    with pytest.raises(GroupsIncomplete, match=r"group 'b' has 1 items, expected group_size 2"):
        adapter.compute_rewards(videos, ["a0", "a1", "b0"], ["a", "a", "b"], group_size=2)
    panel = RewardPanel([PanelTerm("video", backend)], group_size=2, owns_backends=False)
    with pytest.raises(GroupsIncomplete) as info:
        DecodedVideoRewards(panel, Decoder()).compute_rewards(
            videos, ["a0", "a1", "b0"], ["a", "a", "b"]
        )
    assert (info.value.group_size, info.value.counts) == (2, {"b": 1})
    with pytest.raises(GroupSizeConflict, match="group_size 3, the panel's config 2") as conflict:
        DecodedVideoRewards(panel, Decoder()).compute_rewards(
            videos, ["a0", "a1", "a2"], ["a", "a", "a"], group_size=3
        )
    assert (conflict.value.requested, conflict.value.configured) == (3, 2)
    assert service.enqueues == 0
