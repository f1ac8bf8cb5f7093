"""Posttrain's rank-local decoded-video adapter, in front of a job backend (JobRewardBackend).

Online WFM scores each final latent through a model-owned decoder, on the rank that owns the
trajectory. Why a checked adapter: a decoder that emits [0, 1] (or garbage) would still make
uint8 videos and finite scores, silently wrong ones. So the decoder must attest
`output_range="neg_one_to_one"`, and its one result must be a floating, finite [1,3,T,H,W]
array within [-1, 1] (an overshoot of at most `range_tolerance` is clamped away). It is decoded
under torch.no_grad() (when the decoder is torch's) and mapped to CPU uint8 by the exact fp32
clamp-then-scale transform `rint((clamp(x, -1, 1) + 1) * 127.5)`, then sent as an RGB THWC
video: the job backend uploads it as [1,3,T,H,W] with media_type "video" and its FPS.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from supervisor.backend import RewardBackend
from supervisor.errors import ConfigError, ScorerRequestError
from supervisor.types import RewardItem, RewardRequest, RewardResponse

NEG_ONE_TO_ONE = "neg_one_to_one"
SCALE = np.float32(127.5)


class DecoderNotAttested(ConfigError):
    """The decoder does not attest `output_range="neg_one_to_one"`: its videos cannot be mapped."""


class DecodedVideoError(ScorerRequestError):
    """The decoder's result for one trajectory is not a video the service may score (nothing of
    the call is sent)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="bad_input")


class DecodedVideoShape(DecodedVideoError):
    """Not one floating [1,3,T,H,W] result."""


class DecodedVideoNotFinite(DecodedVideoError):
    """A NaN or an infinity in the decoded video."""


class DecodedVideoOutOfRange(DecodedVideoError):
    """Values materially outside [-1, 1]: the decoder's attestation does not hold."""


def _as_float64(decoded: Any, where: str) -> np.ndarray:
    """The decoder's result on the CPU, exactly (float64 holds every fp16/bf16/fp32 value)."""
    if hasattr(decoded, "detach"):  # a torch tensor, any device and dtype
        if not decoded.is_floating_point():
            raise DecodedVideoShape(f"{where}: the decoder returned {decoded.dtype}, not floats")
        return np.asarray(decoded.detach().to("cpu").double().numpy())
    array = np.asarray(decoded)
    if array.dtype.kind != "f":
        raise DecodedVideoShape(f"{where}: the decoder returned {array.dtype}, not floats")
    return array.astype(np.float64)


def to_uint8_video(decoded: Any, where: str = "video", range_tolerance: float = 1e-2) -> np.ndarray:
    """One decoded [1,3,T,H,W] result in [-1, 1] as CPU uint8 THWC (what `RewardItem.video`
    holds), checked: DecodedVideoShape, DecodedVideoNotFinite or DecodedVideoOutOfRange."""
    array = _as_float64(decoded, where)
    if array.ndim != 5 or array.shape[:2] != (1, 3) or 0 in array.shape:
        raise DecodedVideoShape(
            f"{where}: the decoder returned shape {list(array.shape)}, expected one [1,3,T,H,W] "
            f"video"
        )
    if not np.isfinite(array).all():
        raise DecodedVideoNotFinite(
            f"{where}: the decoded video holds {int((~np.isfinite(array)).sum())} NaN/inf values"
        )
    low, high = float(array.min()), float(array.max())
    if low < -1 - range_tolerance or high > 1 + range_tolerance:
        raise DecodedVideoOutOfRange(
            f"{where}: the decoded video spans [{low:g}, {high:g}], outside [-1, 1] by more than "
            f"{range_tolerance:g}: the decoder attests neg_one_to_one, so it is refused"
        )
    clamped = np.clip(array.astype(np.float32), np.float32(-1), np.float32(1))
    scaled = np.rint((clamped + np.float32(1)) * SCALE).astype(np.uint8)
    return np.ascontiguousarray(scaled[0].transpose(1, 2, 3, 0))


class DecodedVideoRewards:
    """Decodes each trajectory's latent with the model's decoder and scores the videos through
    `backend` (a JobRewardBackend, a panel over one, or DistributedRewards over either: WFM's one
    trajectory per rank). Every video is checked before anything is sent."""

    def __init__(
        self,
        backend: RewardBackend,
        decoder: Callable[[Any], Any],
        range_tolerance: float = 1e-2,
    ) -> None:
        attested = getattr(decoder, "output_range", None)
        if attested != NEG_ONE_TO_ONE:
            raise DecoderNotAttested(
                f"the decoder must attest output_range={NEG_ONE_TO_ONE!r} (got {attested!r}): "
                f"set it on the decoder once its outputs are known to lie in [-1, 1]"
            )
        if not 0 <= range_tolerance < 1:
            raise ConfigError(f"range_tolerance must be in [0, 1), got {range_tolerance!r}")
        self.backend, self.decoder, self.range_tolerance = backend, decoder, range_tolerance

    def decode(self, latent: Any, item_id: str) -> np.ndarray:
        """One latent's video, CPU uint8 THWC; under torch.no_grad() when torch is loaded."""
        torch = sys.modules.get("torch")
        with torch.no_grad() if torch is not None else contextlib.nullcontext():
            decoded = self.decoder(latent)
        return to_uint8_video(decoded, f"trajectory {item_id!r}", self.range_tolerance)

    def compute_rewards(
        self,
        latents: Sequence[Any],
        ids: Sequence[str],
        group_ids: Sequence[str | None] | None = None,
        *,
        prompt: str | None = None,
        group_size: int | None = None,
        step: int | None = None,
    ) -> RewardResponse:
        """The rewards of these trajectories (this rank's), in order; `group_ids`: each one's
        group, `group_size` its declared size (or the backend's config): groups are checked
        complete by the backend, over every rank under DistributedRewards."""
        if len(latents) != len(ids) or (group_ids is not None and len(group_ids) != len(ids)):
            raise ConfigError("latents, ids and group_ids must have one entry per trajectory")
        groups = list(group_ids) if group_ids is not None else [None] * len(ids)
        items = [
            RewardItem(
                id=item_id, group_id=group, prompt=prompt, video=self.decode(latent, item_id)
            )
            for latent, item_id, group in zip(latents, ids, groups, strict=True)
        ]
        request = RewardRequest(items=items, group_size=group_size, step=step)
        return self.backend.compute_rewards(request)
