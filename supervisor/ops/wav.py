"""WAV files for the CLI's audio column: a small RIFF reader (stdlib `struct` and numpy, no new
dependency).

It takes what torchaudio, soundfile and TTS pipelines write: PCM (format 1) of 8 (unsigned), 16, 24
or 32 bits, IEEE float (format 3) of 32 or 64 bits, and WAVE_FORMAT_EXTENSIBLE (0xFFFE) whose
subformat is either of those (the container width counts: 24 valid bits in 32 are read as 32-bit
PCM, which is what the format says). The waveform comes back as float32 (channels, samples): PCM
divided by 2 ** (bits - 1), exact for 8, 16 and 24 bits; float samples as written (not clipped),
refused when one is NaN or infinite. A data chunk of unknown size (0xFFFFFFFF, what a writer to a
pipe leaves) runs to the end of the file. Anything else (A-law, ADPCM, RF64, big-endian RIFX) is
refused naming the file and what to convert it to, never guessed at.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import BinaryIO, NamedTuple

import numpy as np

FORMAT_PCM, FORMAT_FLOAT, FORMAT_EXTENSIBLE = 1, 3, 0xFFFE
# The 16-byte subformat GUID of WAVE_FORMAT_EXTENSIBLE is the format code then these 14 bytes
# (KSDATAFORMAT).
GUID_TAIL = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
PCM_WIDTHS = (1, 2, 3, 4)  # bytes: 8-bit unsigned, 16, 24 and 32-bit signed
FLOAT_WIDTHS = (4, 8)
UNKNOWN_SIZE = 0xFFFFFFFF  # the data size a writer that cannot seek back leaves (ffmpeg to a pipe)
CONVERT_HINT = (
    "audio here is 8, 16, 24 or 32-bit PCM or 32/64-bit IEEE float, plain or "
    "WAVE_FORMAT_EXTENSIBLE: convert it, e.g. `ffmpeg -i in.wav -c:a pcm_s16le out.wav`"
)


class WavError(ValueError):
    """A file is not a WAV this reader takes, or it is cut short (names the file and why)."""


class WavHeader(NamedTuple):
    channels: int
    width: int  # bytes a sample
    frames: int
    rate: int  # Hz
    floating: bool = False  # IEEE float samples, else PCM


class _Layout(NamedTuple):
    header: WavHeader
    offset: int  # where the samples start in the file


def check_wav(path: Path) -> WavHeader:
    """The header, checked for everything `read_wav` will need (a format read here, a rate, a
    channel, a frame), and the last frame the header claims read: a file cut short fails here, not
    mid-run."""
    with _opened(path) as handle:
        header, offset = _layout(handle, path)
        frame = header.channels * header.width
        handle.seek(offset + (header.frames - 1) * frame)
        last = handle.read(frame)
    if len(last) != frame:
        raise WavError(
            f"{path} is cut short: its header says {header.frames} frames, the last one is missing"
        )
    return header


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """The waveform as float32 (channels, samples) and its sample rate in Hz."""
    with _opened(path) as handle:
        header, offset = _layout(handle, path)
        handle.seek(offset)
        size = header.frames * header.channels * header.width
        data = handle.read(size)
    if len(data) != size:
        raise WavError(f"{path} is cut short: {len(data)} bytes of samples, the header says {size}")
    if header.floating:
        samples = np.frombuffer(data, f"<f{header.width}").astype(np.float32)
        if not np.isfinite(samples).all():
            raise WavError(f"{path} holds NaN or infinite float samples")
    else:
        samples = pcm_to_float32(data, header.width)
    return samples.reshape(header.frames, header.channels).T.copy(), header.rate


def _opened(path: Path) -> BinaryIO:
    try:
        return open(path, "rb")
    except OSError as exc:
        raise WavError(f"{path} is not a readable WAV ({type(exc).__name__}: {exc})") from exc


def _layout(handle: BinaryIO, path: Path) -> _Layout:
    """The fmt chunk's header and where the data chunk's samples start (chunks between are
    skipped)."""
    riff = handle.read(12)
    if len(riff) < 12 or riff[:4] != b"RIFF" or riff[8:12] != b"WAVE":
        kind = {b"RIFX": "a big-endian RIFX", b"RF64": "an RF64"}.get(riff[:4], "not a RIFF/WAVE")
        raise WavError(f"{path} is {kind} file; {CONVERT_HINT}")
    header: WavHeader | None = None
    while True:
        chunk = handle.read(8)
        if len(chunk) < 8:
            raise WavError(f"{path} is cut short: no {'data' if header else 'fmt'} chunk")
        name, size = chunk[:4], struct.unpack("<I", chunk[4:])[0]
        if name == b"data":
            if header is None:
                raise WavError(f"{path} has its data chunk before its fmt chunk")
            # a streaming writer (ffmpeg to a pipe, sox): samples run to the end
            if size == UNKNOWN_SIZE:
                size = os.fstat(handle.fileno()).st_size - handle.tell()
            frames = size // (header.channels * header.width)
            return _Layout(_usable(header._replace(frames=frames), path), handle.tell())
        if name == b"fmt ":
            body = handle.read(size)
            if len(body) < size:
                raise WavError(f"{path} is cut short in its fmt chunk")
            header = _format(body, path)
            handle.seek(size & 1, 1)
        else:
            # LIST, fact, PEAK...: chunks are padded to an even size
            handle.seek(size + (size & 1), 1)


def _format(body: bytes, path: Path) -> WavHeader:
    """The fmt chunk: format code (the subformat's for EXTENSIBLE), channels, rate, sample width."""
    if len(body) < 16:
        raise WavError(f"{path} has a fmt chunk of {len(body)} bytes (16 at least)")
    code, channels, rate, _, _, bits = struct.unpack("<HHIIHH", body[:16])
    if code == FORMAT_EXTENSIBLE:
        if len(body) < 40 or body[26:40] != GUID_TAIL:
            raise WavError(
                f"{path} is WAVE_FORMAT_EXTENSIBLE with a subformat not read here; {CONVERT_HINT}"
            )
        code = struct.unpack("<H", body[24:26])[0]
    width, floating = bits // 8, code == FORMAT_FLOAT
    widths = FLOAT_WIDTHS if floating else PCM_WIDTHS
    if code not in (FORMAT_PCM, FORMAT_FLOAT) or bits % 8 or width not in widths:
        kind = "IEEE float" if floating else "PCM" if code == FORMAT_PCM else f"format {code:#x}"
        raise WavError(f"{path} is {bits}-bit {kind}; {CONVERT_HINT}")
    return WavHeader(channels, width, 0, rate, floating)


def _usable(header: WavHeader, path: Path) -> WavHeader:
    """Refused unless a waveform can be made of it: a channel, a frame, a rate."""
    if header.channels < 1 or header.frames < 1 or header.rate < 1:
        kind = "float" if header.floating else "PCM"
        raise WavError(
            f"{path} has {header.channels} channel(s) of {header.frames} "
            f"{8 * header.width}-bit {kind} samples at {header.rate} Hz: audio here has at "
            f"least one channel, one sample and 1 Hz"
        )
    return header


def pcm_to_float32(data: bytes, width: int) -> np.ndarray:
    """Little-endian PCM samples of `width` bytes (8-bit unsigned, wider signed) -> float32 in [-1,
    1)."""
    if width == 1:
        return ((np.frombuffer(data, np.uint8).astype(np.float32) - 128.0) / 128.0).astype(
            np.float32
        )
    if width == 3:
        raw = np.frombuffer(data, np.uint8).reshape(-1, 3).astype(np.int32)
        values = raw[:, 0] | (raw[:, 1] << 8) | (raw[:, 2] << 16)
        values = np.where(values >= 1 << 23, values - (1 << 24), values)
    elif width in (2, 4):
        values = np.frombuffer(data, f"<i{width}")
    else:
        raise WavError(f"{8 * width}-bit PCM is not read here (8, 16, 24 or 32 bits)")
    return (values.astype(np.float64) / float(1 << (8 * width - 1))).astype(np.float32)
