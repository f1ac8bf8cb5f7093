"""UniRL's `video_b64`: an mp4 (UniRL's client writes it with diffusers' `export_to_video`) decoded
with PyAV into the binary frame's video layout, THWC uint8 RGB.

Bounded: only the mp4 demuxer reads the bytes (no other FFmpeg format: a concat list or a playlist
would read the server's files), only the codecs a clip is written in decode, and each frame is
charged (`charge`, the call's media budget) at its header size as it comes out of the decoder, at
most MAX_FRAMES of them, each copied out of PyAV's buffer. PyAV is imported here only: a scorer env
without it refuses a video turn with a 400 that names it.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from child_runtime.protocol.items import RequestError

if TYPE_CHECKING:
    import numpy as np

AV_PIN = "av==18.1.0"  # what supervisor/env_specs/image.txt installs
# a reward clip is seconds long (UniRL writes 8 fps); 200,000 tiny frames would pass a byte budget
MAX_FRAMES = 1024
CODECS = frozenset({"h264", "hevc", "vp8", "vp9", "av1", "mpeg4"})


def decode_video(data: bytes, where: str, charge: Callable[[int, str], None]) -> np.ndarray:
    """The clip's frames, in order, as one THWC uint8 RGB array; RequestError names what is
    wrong."""
    try:
        import av
        import numpy
    except ImportError as exc:
        raise RequestError(
            f"{where}: this python cannot decode video (it lacks {exc.name}: add {AV_PIN} to "
            "the scorer's env, or pip install 'managed-scorers[video]' where serve runs)"
        ) from exc
    try:
        with av.open(io.BytesIO(data), mode="r", format="mp4") as container:
            frames = _frames(container, where, charge)
    except RequestError:
        raise
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        raise RequestError(f"{where} is not a readable mp4: {exc}"[:300]) from exc
    if not frames:
        raise RequestError(f"{where} holds no frame")
    return numpy.stack(frames)


def _frames(container: Any, where: str, charge: Callable[[int, str], None]) -> list[np.ndarray]:
    """Each frame of the first video stream, charged at the header's size before it is decoded."""
    if not container.streams.video:
        raise RequestError(f"{where} holds no video stream")
    stream = container.streams.video[0]
    if stream.codec_context.name not in CODECS:
        raise RequestError(
            f"{where}: codec {stream.codec_context.name!r} is not one of {sorted(CODECS)}"
        )
    size = 3 * stream.codec_context.width * stream.codec_context.height
    if size <= 0:
        raise RequestError(f"{where}: its header gives no frame size")
    frames: list[np.ndarray] = []
    for frame in container.decode(stream):
        if len(frames) == MAX_FRAMES:
            raise RequestError(f"{where} holds more than {MAX_FRAMES} frames")
        charge(size, where)
        pixels = frame.to_ndarray(format="rgb24")
        if 3 * pixels.shape[0] * pixels.shape[1] != size:
            raise RequestError(f"{where}: frame {len(frames)} changes the clip's size")
        frames.append(pixels.copy())  # not a view of PyAV's padded buffer
    return frames
