"""The audio column's WAV reader on real files: IEEE float and WAVE_FORMAT_EXTENSIBLE as torchaudio,
soundfile and TTS pipelines write them, one written by scipy, and the ones it refuses, by file."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from supervisor.ops.wav import GUID_TAIL, WavError, check_wav, read_wav
from tests.conftest import REPO_ROOT

RATE = 24000


def riff(path: Path, fmt: bytes, samples: bytes, extra: bytes = b"", head: bytes = b"RIFF") -> Path:
    """A WAV: the fmt chunk given, any `extra` chunks, then the data chunk (padded to an even
    size)."""
    chunks = (
        b"fmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + extra
        + b"data"
        + struct.pack("<I", len(samples))
        + samples
    )
    body = b"WAVE" + chunks + b"\x00" * (len(samples) & 1)
    path.write_bytes(head + struct.pack("<I", len(body)) + body)
    return path


def fmt_chunk(code: int, channels: int, bits: int, rate: int = RATE) -> bytes:
    block = channels * bits // 8
    return struct.pack("<HHIIHH", code, channels, rate, rate * block, block, bits)


def extensible(
    sub: int, channels: int, bits: int, valid: int | None = None, tail: bytes = GUID_TAIL
) -> bytes:
    """WAVE_FORMAT_EXTENSIBLE (what soundfile and torchaudio write for more than two channels or 24
    bits in 32)."""
    guid = struct.pack("<H", sub) + tail
    return fmt_chunk(0xFFFE, channels, bits) + struct.pack("<HHI", 22, valid or bits, 0x3) + guid


# (channels, samples)
WAVE = np.array([[0.5, -0.25, 1.5, -1.0], [0.0, 0.125, -0.5, 0.75]], np.float32)


def interleaved(dtype: str) -> bytes:
    return WAVE.T.astype(dtype).tobytes()


def test_ieee_float_wavs_32_and_64_bit_read_as_written(tmp_path):
    # float writers add a fact chunk; it is skipped
    fact = b"fact" + struct.pack("<II", 4, WAVE.shape[1])
    # cbSize 0
    f32 = riff(tmp_path / "f32.wav", fmt_chunk(3, 2, 32) + b"\x00\x00", interleaved("<f4"), fact)
    f64 = riff(tmp_path / "f64.wav", fmt_chunk(3, 2, 64), interleaved("<f8"))
    for path, width in ((f32, 4), (f64, 8)):
        assert check_wav(path) == (2, width, 4, RATE, True)
        audio, rate = read_wav(path)
        # 1.5 kept: not clipped
        assert rate == RATE and audio.dtype == np.float32 and np.array_equal(audio, WAVE)


def test_a_wav_streamed_to_a_pipe_runs_to_the_end_of_the_file(tmp_path):
    """ffmpeg writing to a pipe cannot seek back: its RIFF and data sizes stay 0xFFFFFFFF."""
    path = riff(tmp_path / "piped.wav", fmt_chunk(3, 2, 32), interleaved("<f4"))
    raw = bytearray(path.read_bytes())
    raw[4:8] = raw[raw.index(b"data") + 4 : raw.index(b"data") + 8] = b"\xff\xff\xff\xff"
    path.write_bytes(bytes(raw))
    assert check_wav(path) == (2, 4, 4, RATE, True)
    assert np.array_equal(read_wav(path)[0], WAVE)


def test_extensible_wavs_of_float_and_pcm_subformats_with_a_list_chunk_before_the_data(tmp_path):
    listing = b"LIST" + struct.pack("<I", 5) + b"INFOx" + b"\x00"  # an odd size: padded to even
    ext_float = riff(tmp_path / "ef.wav", extensible(3, 2, 32), interleaved("<f4"), listing)
    assert np.array_equal(read_wav(ext_float)[0], WAVE)
    pcm = (WAVE.clip(-1, 0.99) * (1 << 31)).astype(np.int64)
    pcm_bytes = pcm.T.astype("<i4").tobytes()
    # 24 valid bits in 32
    ext_pcm = riff(tmp_path / "ep.wav", extensible(1, 2, 32, valid=24), pcm_bytes)
    assert check_wav(ext_pcm) == (2, 4, 4, RATE, False)
    assert np.allclose(read_wav(ext_pcm)[0], WAVE.clip(-1, 0.99), atol=1e-7)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("adpcm", "is 4-bit format 0x2"),
        ("guid", "WAVE_FORMAT_EXTENSIBLE with a subformat not read here"),
        ("rifx", "big-endian RIFX"),
        ("float16", "is 16-bit IEEE float"),
        ("nan", "NaN or infinite"),
        ("cut", "is cut short"),
        ("zero_rate", "at 0 Hz"),
        ("no_data", "no data chunk"),
    ],
)
def test_what_does_not_decode_is_refused_naming_the_file(tmp_path, name, message):
    samples = interleaved("<f4")
    files = {
        "adpcm": lambda p: riff(p, fmt_chunk(2, 1, 4), b"\x00" * 8),
        "guid": lambda p: riff(p, extensible(3, 2, 32, tail=b"\x01" * 14), samples),
        "rifx": lambda p: riff(p, fmt_chunk(1, 1, 16), b"\x00" * 8, head=b"RIFX"),
        "float16": lambda p: riff(p, fmt_chunk(3, 1, 16), b"\x00" * 8),
        "nan": lambda p: riff(p, fmt_chunk(3, 1, 32), np.array([0.0, np.nan], "<f4").tobytes()),
        "cut": lambda p: p.write_bytes(riff(p, fmt_chunk(3, 2, 32), samples).read_bytes()[:-4]),
        "zero_rate": lambda p: riff(p, fmt_chunk(3, 2, 32, rate=0), samples),
        "no_data": lambda p: p.write_bytes(
            b"RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00" + fmt_chunk(3, 1, 32)
        ),
    }
    path = tmp_path / f"{name}.wav"
    files[name](path)
    with pytest.raises(WavError, match=message) as refused:
        read_wav(path) if name == "nan" else check_wav(path)
    assert str(path) in str(refused.value)
    if name not in ("nan", "cut"):
        with pytest.raises(WavError, match=message):
            read_wav(path)


SCIPY = REPO_ROOT / "envs" / "embed" / ".venv" / "bin" / "python"
WRITE_WITH_SCIPY = """
import sys, numpy as np
from scipy.io import wavfile

wave = np.array([[0.5, 0.0], [-0.25, 0.125], [1.5, -0.5], [-1.0, 0.75]], np.float32)
wavfile.write(sys.argv[1], 22050, wave)  # float32: format 3, with a cbSize and a fact chunk
wavfile.write(
    sys.argv[2], 22050, np.repeat((wave * 16000).astype(np.int16), 2, axis=1)
)  # 4 channels of PCM
wavfile.write(sys.argv[3], 8000, wave.astype(np.float64))  # 64-bit float
"""


@pytest.mark.skipif(
    not SCIPY.exists(), reason="envs/embed (which has scipy) is not built: `make env-embed`"
)
def test_wavs_that_scipy_writes_read_back(tmp_path):
    floats, pcm, doubles = (
        tmp_path / "scipy-f32.wav",
        tmp_path / "scipy-s16.wav",
        tmp_path / "scipy-f64.wav",
    )
    subprocess.run(
        [str(SCIPY), "-c", WRITE_WITH_SCIPY, *map(str, (floats, pcm, doubles))],
        check=True,
        timeout=120,
    )
    audio, rate = read_wav(floats)
    assert rate == 22050 and np.array_equal(audio, WAVE)
    audio, rate = read_wav(doubles)
    assert rate == 8000 and check_wav(doubles).width == 8 and np.array_equal(audio, WAVE)
    audio, rate = read_wav(pcm)
    assert audio.shape == (4, 4) and np.array_equal(
        audio[::2], (WAVE * 16000).astype(np.int16) / 32768
    )
