"""Audio as an input kind: float32 (channels, samples) with its sample rate, checked on both sides
of the wire and carried losslessly (in-band and through the shared segment) to a managed child."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from pydantic import ValidationError

from child_runtime.protocol import wire
from child_runtime.protocol.items import Limits, RequestError, item_from_wire
from supervisor import RewardItem, RewardRequest
from tests.helpers.fixture_scorers import audio_checksum

FIXTURES = "tests.helpers.fixture_scorers"
RATES = [8000, 16000, 22050, 44100, 48000]


def waveforms() -> list[np.ndarray]:
    """Different lengths and channel counts, one of them 1-D (mono), every value a random
    float32."""
    rng = np.random.default_rng(27)
    shapes = [(1, 100), (2, 40000), (6, 12345), (20000,), (1, 70001)]
    return [rng.standard_normal(shape).astype(np.float32) for shape in shapes]


def test_a_1d_waveform_is_mono_viewed_not_copied_and_the_wire_item_keeps_the_rate():
    mono = np.linspace(-1, 1, 9, dtype=np.float32)
    item = RewardItem(id="m", audio=mono, audio_sample_rate=16000)
    assert item.audio.shape == (1, 9) and np.shares_memory(item.audio, mono)
    wired = item.to_wire()
    assert wired["audio_sample_rate"] == 16000 and wired["audio"] is item.audio
    back = item_from_wire(wire.decode(wire.encode(wired)), 0)
    assert back.audio.tobytes() == mono.tobytes() and back.audio_sample_rate == 16000
    assert back.audio.flags.writeable is False and item.has_media


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        (
            {"audio": np.array([[0.0, np.nan, 0.5]], np.float32), "audio_sample_rate": 8000},
            r"item 'x'.*non-finite.*sample 1",
        ),
        (
            {"audio": np.array([[0.0, 0.1], [np.inf, 0]], np.float32), "audio_sample_rate": 8000},
            r"channel 1, sample 0",
        ),
        (
            {"audio": np.zeros((1, 4), np.float32)},
            r"item 'x'.*audio_sample_rate must be a positive int",
        ),
        ({"audio": np.zeros((1, 4), np.float32), "audio_sample_rate": 0}, "positive int"),
        ({"audio_sample_rate": 16000}, "has no audio"),
        (
            {"audio": np.zeros((2, 3, 4), np.float32), "audio_sample_rate": 8000},
            r"float32 \(channels, samples\)",
        ),
        (
            {"audio": np.zeros((48000, 2), np.float32), "audio_sample_rate": 8000},
            "must be transposed",
        ),
        ({"audio": np.zeros((1, 0), np.float32), "audio_sample_rate": 8000}, "at least one sample"),
        ({"audio": np.zeros((1, 4), np.float64), "audio_sample_rate": 8000}, "got float64"),
        ({"audio": [0.0, 0.1], "audio_sample_rate": 8000}, "got list"),
    ],
)
def test_bad_audio_is_a_validation_error_naming_the_item(fields, match):
    with pytest.raises(ValidationError, match=match):
        RewardItem(id="x", **fields)


def test_a_bool_or_text_sample_rate_is_refused():
    for rate in (True, "16000", 16000.0):
        with pytest.raises(ValidationError, match="audio_sample_rate"):
            RewardItem(id="x", audio=np.zeros((1, 4), np.float32), audio_sample_rate=rate)


def test_the_child_side_refuses_what_a_client_other_than_ours_might_send():
    """The child runs the same checks on the decoded wire item (a 4xx, the child keeps serving)."""
    bad = {"id": "w", "audio": np.array([[np.nan]], np.float32), "audio_sample_rate": 8000}
    with pytest.raises(RequestError, match=r"items\[0\] \(id='w'\)\.audio has a non-finite sample"):
        item_from_wire(wire.decode(wire.encode(bad)), 0)
    with pytest.raises(RequestError, match=r"audio_sample_rate must be a positive int"):
        item_from_wire({"id": "w", "audio": np.zeros((1, 2), np.float32)}, 0)
    # the media limit, as for images
    with pytest.raises(RequestError, match=r"has 8 bytes \(limit 4\)"):
        item_from_wire(
            {"id": "w", "audio": np.zeros((1, 2), np.float32), "audio_sample_rate": 1},
            0,
            Limits(max_media_bytes=4),
        )


@pytest.mark.slow
def test_audio_reaches_a_managed_child_bit_for_bit_in_band_and_through_the_segment(
    managed, image_python
):
    backend = managed(image_python, f"{FIXTURES}:AudioEcho", "audio")
    assert backend.ready_info["shared_memory"] is True
    sent = waveforms()
    request = RewardRequest(
        items=[
            RewardItem(id=f"a{i}", audio=w, audio_sample_rate=RATES[i]) for i, w in enumerate(sent)
        ]
    )
    small = RewardRequest(items=[request.items[0]])  # 400 bytes: in-band
    for req, backing in ((request, "mmap"), (small, "bytes")):
        response = backend.compute_rewards(req)
        expected = [audio_checksum(item.audio) for item in req.items]
        assert response.component_rewards["checksum"] == expected
        assert response.component_rewards["channels"] == [
            float(item.audio.shape[0]) for item in req.items
        ]
        assert response.component_rewards["samples"] == [
            float(item.audio.shape[1]) for item in req.items
        ]
        assert response.component_rewards["rate"] == [
            float(item.audio_sample_rate) for item in req.items
        ]
        assert response.diagnostics["audio_echo"]["values"][f"{backing}_backed"] == len(req.items)
    # the checksum is of the trainer's own bytes: 1-D mono arrived as (1, samples) of the same
    # floats
    assert audio_checksum(request.items[3].audio) == float(
        int.from_bytes(hashlib.sha256(sent[3].tobytes()).digest()[:6], "big")
    )
