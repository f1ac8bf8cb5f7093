"""WAV files for the CLI's audio column, read with the stdlib `wave` module (no new dependency).

PCM of 8 (unsigned), 16, 24 or 32 bits becomes float32 (channels, samples) in [-1, 1): a sample
divided by 2 ** (bits - 1), exact for 8, 16 and 24 bits (32-bit PCM keeps float32's 24 bits).
IEEE float WAVs (format 3), and WAVE_FORMAT_EXTENSIBLE ones before Python 3.12, are not PCM the
stdlib reads: they are refused naming the file and what to convert them to, never guessed at.
"""

from __future__ import annotations

import wave
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import numpy as np

SAMPLE_WIDTHS = (1, 2, 3, 4)  # bytes: 8-bit unsigned, 16, 24 and 32-bit signed PCM
UNREADABLE_HINT = (
    "format 3 is IEEE float and 65534 WAVE_FORMAT_EXTENSIBLE, which the stdlib reads from Python 3.12 on: "
    "convert it to plain PCM, e.g. `ffmpeg -i in.wav -c:a pcm_s16le out.wav`"
)


class WavError(ValueError):
    """A file is not a WAV this reader takes, or it is cut short (names the file and why)."""


class WavHeader(NamedTuple):
    channels: int
    width: int  # bytes a sample
    frames: int
    rate: int  # Hz


def check_wav(path: Path) -> WavHeader:
    """The header, checked for everything `read_wav` will need (PCM of 8 to 32 bits, a rate, a channel,
    a frame), and the last frame the header claims read: a file cut short fails here, not mid-run."""
    with _opened(path) as handle:
        header = _header(handle, path)
        handle.setpos(header.frames - 1)
        last = handle.readframes(1)
    if len(last) != header.channels * header.width:
        raise WavError(f"{path} is cut short: its header says {header.frames} frames, the last one is missing")
    return header


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """The waveform as float32 (channels, samples) and its sample rate in Hz."""
    with _opened(path) as handle:
        channels, width, frames, rate = _header(handle, path)
        data = handle.readframes(frames)
    if len(data) != frames * channels * width:
        raise WavError(
            f"{path} is cut short: {len(data)} bytes of samples, the header says {frames * channels * width}"
        )
    return pcm_to_float32(data, width).reshape(frames, channels).T.copy(), rate


@contextmanager
def _opened(path: Path) -> Iterator[wave.Wave_read]:
    """The file open for reading; whatever the stdlib raises, opening or reading it, as a WavError."""
    try:
        with wave.open(str(path), "rb") as handle:
            yield handle
    except wave.Error as exc:
        hint = f"; {UNREADABLE_HINT}" if "unknown format" in str(exc) else ""
        raise WavError(f"{path} is not a PCM WAV the stdlib reads ({exc}){hint}") from exc
    except (EOFError, OSError, RuntimeError) as exc:  # RuntimeError: a chunk's seek past its end
        raise WavError(f"{path} is not a readable WAV ({type(exc).__name__}: {exc})") from exc


def _header(handle: wave.Wave_read, path: Path) -> WavHeader:
    """(channels, width, frames, rate), refused unless a waveform can be made of them."""
    header = WavHeader(handle.getnchannels(), handle.getsampwidth(), handle.getnframes(), handle.getframerate())
    if header.width not in SAMPLE_WIDTHS or header.channels < 1 or header.frames < 1 or header.rate < 1:
        raise WavError(
            f"{path} has {header.channels} channel(s) of {header.frames} {8 * header.width}-bit samples at "
            f"{header.rate} Hz: audio here is 8, 16, 24 or 32-bit PCM with at least one channel, one sample and 1 Hz"
        )
    return header


def pcm_to_float32(data: bytes, width: int) -> np.ndarray:
    """Little-endian PCM samples of `width` bytes (8-bit unsigned, wider signed) -> float32 in [-1, 1)."""
    if width == 1:
        return ((np.frombuffer(data, np.uint8).astype(np.float32) - 128.0) / 128.0).astype(np.float32)
    if width == 3:
        raw = np.frombuffer(data, np.uint8).reshape(-1, 3).astype(np.int32)
        values = raw[:, 0] | (raw[:, 1] << 8) | (raw[:, 2] << 16)
        values = np.where(values >= 1 << 23, values - (1 << 24), values)
    elif width in (2, 4):
        values = np.frombuffer(data, f"<i{width}")
    else:
        raise WavError(f"{8 * width}-bit PCM is not read here (8, 16, 24 or 32 bits)")
    return (values.astype(np.float64) / float(1 << (8 * width - 1))).astype(np.float32)
