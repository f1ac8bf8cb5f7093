"""audio_loudness: how far a waveform's RMS loudness is from a target, in dB. NumPy only.

Loudness is 20 * log10(RMS) over every channel and sample, in dBFS (full scale is 1.0: a constant
0.1 is -20 dBFS, a full-scale sine -3.01), floored at `floor_dbfs` so silence has a finite value.
The reward is minus the distance to `target_dbfs`: 0 at the target, -1 per dB away. Values
that need no model, so a test checks them by hand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from scorers.base import ScoreItem, Scorer, ScoreResult, ScorerSpec
from scorers.diagnostics import mean


def rms_dbfs(audio: np.ndarray, floor_dbfs: float) -> float:
    """RMS over all channels and samples in dBFS, in float64, never below `floor_dbfs`."""
    power = float(np.mean(np.square(audio, dtype=np.float64)))
    if power <= 0.0:
        return floor_dbfs
    return max(10.0 * math.log10(power), floor_dbfs)


class AudioLoudness(Scorer):
    """-|loudness - target_dbfs| per item; the mean loudness is reported as `mean_dbfs`."""

    spec = ScorerSpec(
        name="audio_loudness",
        input_kind="audio",
        required_fields=("audio",),
        terms=("audio_loudness",),
        revision="rms-dbfs-1",
        env="image",
        diagnostics=("mean_dbfs",),
    )

    def __init__(self, target_dbfs: float = -20.0, floor_dbfs: float = -100.0) -> None:
        for name, value in (("target_dbfs", target_dbfs), ("floor_dbfs", floor_dbfs)):
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
            ):
                raise ValueError(f"audio_loudness: {name} must be a finite number, got {value!r}")
        if floor_dbfs >= target_dbfs:
            raise ValueError(
                f"audio_loudness: floor_dbfs {floor_dbfs} must be below target_dbfs {target_dbfs}"
            )
        self.target_dbfs, self.floor_dbfs = float(target_dbfs), float(floor_dbfs)

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        levels = [rms_dbfs(item.required_audio()[0], self.floor_dbfs) for item in items]
        return ScoreResult(
            terms={"audio_loudness": [-abs(level - self.target_dbfs) for level in levels]},
            diagnostics={"mean_dbfs": mean(sum(levels), len(levels))},
        )
