"""Hostile `video_b64` payloads through the UniRL route's decoder, run in the image env (PyAV):
`python -m tests.helpers.unirl_video_cases WORKDIR` prints one JSON line, each case's outcome."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import av
import numpy as np

from child_runtime.protocol.items import RequestError
from child_runtime.protocol.unirl_video import MAX_FRAMES, decode_video


def mp4(frames: int, size: int = 16, codec: str = "mpeg4") -> bytes:
    """A clip of `frames` grey frames, `size` pixels square."""
    out = io.BytesIO()
    with av.open(out, mode="w", format="mp4") as container:
        stream = container.add_stream(codec, rate=8)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for index in range(frames):
            pixels = np.full((size, size, 3), index % 256, np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def outcome(data: bytes) -> str:
    charged: list[int] = []
    try:
        frames = decode_video(data, "turn", lambda size, where: charged.append(size))
    except RequestError as exc:
        return f"refused: {exc}"
    return f"decoded {list(frames.shape)}, charged {sum(charged)}"


def main() -> None:
    workdir = Path(sys.argv[1])
    (workdir / "clip.mp4").write_bytes(mp4(4))
    os.chdir(workdir)  # a relative name: FFmpeg's concat demuxer deems it safe to open
    concat = b"ffconcat version 1.0\nfile 'clip.mp4'\n"
    cases = {
        "plain": outcome(mp4(4)),
        "too many frames": outcome(mp4(MAX_FRAMES + 1, size=16)),
        "a concat list of a server file": outcome(concat),
    }
    print(json.dumps(cases))


if __name__ == "__main__":
    main()
