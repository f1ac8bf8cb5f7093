"""Scenarios of issue 37 items 6 (serve's OpenRLHF route and its JSON bodies) and 7 (`score`'s audio
column), measured: rows of bench.hardening.

CLI and HTTP only (`serve`, `score`, the route, /health), so the same file measures an older tree
("before": run it from that tree) and this one ("now"). A real `serve` of a test scorer (len(text));
its peak memory is the kernel's high-water mark (VmHWM), reset before each request.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from bench.common import stop

ROOT = Path(__file__).resolve().parent.parent
TRAINER = sys.executable
TOKEN = "t" * 32
FLAKY = [
    "--scorer",
    "tests.helpers.fixture_scorers:Flaky",
    "--python",
    TRAINER,
    "--input-kind",
    "text",
]
MIB = 1 << 20


@dataclass
class Served:
    url: str
    route: str
    pid: int
    log: Path

    def health_s(self) -> float:
        began = time.monotonic()
        httpx.get(self.url + "/health", headers={"authorization": f"Bearer {TOKEN}"}, timeout=120)
        return time.monotonic() - began


@contextmanager
def _served(folder: Path) -> Iterator[Served]:
    """`serve` with OpenRLHF's route, from this tree; SIGTERM at the end."""
    ready, log, secret = folder / "ready.json", folder / "serve.log", folder / "secret"
    command = [TRAINER, "-m", "supervisor", "serve", *FLAKY, "--extra-import-path", str(ROOT)]
    with open(ready, "w") as out, open(log, "w") as err:
        server = subprocess.Popen(
            [*command, "--openrlhf-secret-file", str(secret)],
            cwd=ROOT,
            stdout=out,
            stderr=err,
            env={**os.environ, "MANAGED_SCORERS_TOKEN": TOKEN},
        )
    try:
        deadline = time.monotonic() + 60
        while not ready.read_text().endswith("\n"):
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError(f"serve did not start: {log.read_text()[-2000:]}")
            time.sleep(0.05)
        info = json.loads(ready.read_text().splitlines()[0])
        url = f"http://127.0.0.1:{info['port']}"
        served = Served(url, f"{url}/openrlhf/{secret.read_text().strip()}", server.pid, log)
        served.health_s()  # the first reads the scorer's package versions: not part of any row
        yield served
    finally:
        stop(server)


def _post_measured(served: Served, body: bytes) -> dict:
    """POST `body` while /health is asked in a loop: the answer, the server's peak RSS growth, the
    slowest /health answer meanwhile, and the RSS left after."""
    process = psutil.Process(served.pid)
    Path(f"/proc/{served.pid}/clear_refs").write_text("5")  # VmHWM := the RSS now
    before = process.memory_info().rss
    answers: list[httpx.Response] = []
    poster = threading.Thread(
        target=lambda: answers.append(httpx.post(served.route, content=body, timeout=600))
    )
    poster.start()
    waits = []
    while poster.is_alive():
        waits.append(served.health_s())
    poster.join()
    status = Path(f"/proc/{served.pid}/status").read_text().splitlines()
    peak = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    answer = answers[0]
    error = answer.json().get("error", "") if answer.status_code >= 400 else ""
    return {
        "status": answer.status_code,
        "kind": answer.json().get("kind", "") if error else "",
        "error": error,
        "peak": (peak - before) / MIB,
        "left": (process.memory_info().rss - before) / MIB,
        "health_max": max(waits, default=0.0),
        "health_n": len(waits),
    }


def _said(got: dict) -> str:
    answer = f"{got['status']} {got['kind']}".strip()
    return (
        f"{answer}; server peak +{got['peak']:.0f} MiB, +{got['left']:.0f} MiB left after; "
        f"slowest of {got['health_n']} /health meanwhile {got['health_max']:.2f} s"
    )


def empty_objects_16mib() -> str:
    """16 MiB of `[{},{},...]` (json.loads builds ~26 bytes a byte)."""
    with tempfile.TemporaryDirectory() as folder, _served(Path(folder)) as served:
        got = _post_measured(served, b"[" + b"{}," * (16 * MIB // 3 - 1) + b"{}]")
    return f"16 MiB of empty objects: {_said(got)}"


def zeros_label_50mb() -> str:
    """An OpenRLHF request whose label is 50 MB of `[0,0,...]`."""
    head, tail = b'{"query": ["P ab"], "prompts": ["P"], "labels": [[', b"0]]}"
    body = head + b"0," * ((50_000_000 - len(head) - len(tail)) // 2) + tail
    with tempfile.TemporaryDirectory() as folder, _served(Path(folder)) as served:
        got = _post_measured(served, body)
    return f"a 50 MB request (a label of zeros): {_said(got)}"


def half_a_million_values() -> str:
    """A 1 MB request of 500,000 values (a label of zeros): /health while it is parsed."""
    head, tail = b'{"query": ["P ab"], "prompts": ["P"], "labels": [[', b"0]]}"
    body = head + b"0," * 500_000 + tail
    with tempfile.TemporaryDirectory() as folder, _served(Path(folder)) as served:
        got = _post_measured(served, body)
    return f"1 MB, 500,000 values: {_said(got)}"


def nested_deep() -> str:
    """A label nested 5,000 deep."""
    body = b'{"query": ["P a"], "prompts": ["P"], "labels": [' + b"[" * 5000 + b"]" * 5000 + b"]}"
    with tempfile.TemporaryDirectory() as folder, _served(Path(folder)) as served:
        got = _post_measured(served, body)
    paths = got["error"].count('File "')
    first = got["error"].splitlines()[0][:90] if got["error"] else ""
    return f"{got['status']} {got['kind']}: {first!r}; {paths} source paths in the answer"


def error_lines(bad: int = 100) -> str:
    """100 bad bodies in a row (`bad`), then one failing score: ERROR lines on the server's log
    (each kind at once, then once per LOG_EVERY_S, 10 s)."""
    with tempfile.TemporaryDirectory() as folder, _served(Path(folder)) as served:
        began = time.monotonic()
        for _ in range(bad):
            httpx.post(served.route, content=b"[1,", timeout=60)
        failed = json.dumps({"query": ["P raise"], "prompts": ["P"], "labels": [None]}).encode()
        httpx.post(served.route, content=failed, timeout=60)
        took = time.monotonic() - began
        time.sleep(0.2)
        lines = [line for line in served.log.read_text().splitlines() if " ERROR " in line]
    kinds = sorted({line.split(" answered ")[1].split(" (")[0].split(" x")[0] for line in lines})
    return f"{bad + 1} error answers in {took:.1f} s: {len(lines)} ERROR lines ({', '.join(kinds)})"


def _pcm(path: Path, rate: int, channels: int = 1, frames: int = 80, cut: bool = False) -> None:
    samples = b"\x00\x10" * frames * channels
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * channels * 2, channels * 2, 16)
    body = (
        b"WAVE"
        + b"fmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + b"data"
        + struct.pack("<I", len(samples))
        + samples
    )
    whole = b"RIFF" + struct.pack("<I", len(body)) + body
    path.write_bytes(whole[: -2 * channels] if cut else whole)


def _score_audio(folder: Path, odd: dict[int, str], unchecked: bool = False) -> tuple[str, str]:
    """Five rows of WAVs, batch size 1, then --resume: what each run said and wrote."""
    _pcm(folder / "ok.wav", 16000)
    wavs = [odd.get(i, "ok.wav") for i in range(5)]
    (folder / "in.jsonl").write_text(
        "".join(json.dumps({"id": f"r{i}", "wav": w}) + "\n" for i, w in enumerate(wavs))
    )
    models = {"m": {"backend": "local", "scorer": "audio_loudness", "input_kind": "audio"}}
    (folder / "r.json").write_text(
        json.dumps({"reward": {"models": models, "reward_functions": {"t": {"model": "m"}}}})
    )
    skip = (
        "import supervisor.ops.dataset_rows as rows; rows._check_audio = lambda *args: {}; "
        if unchecked
        else ""
    )
    cli = [
        TRAINER,
        "-c",
        f"import sys; {skip}from supervisor.ops.cli import main; sys.exit(main())",
        "score",
    ]
    cli += [
        "--recipe",
        str(folder / "r.json"),
        "--input",
        str(folder / "in.jsonl"),
        "--audio-column",
        "wav",
    ]
    cli += ["--batch-size", "1", "--output", str(folder / "out.jsonl")]
    said = []
    for extra in ([], ["--resume"]):
        done = subprocess.run([*cli, *extra], cwd=ROOT, capture_output=True, text=True, timeout=300)
        out = folder / "out.jsonl"
        rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
        errors = sum(row["reward"] is None for row in rows)
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
        last = last.replace(str(folder) + "/", "")
        said.append(
            f"exit {done.returncode}, {len(rows)} rows written ({errors} with an error): "
            f"{last[:110]!r}"
        )
    return said[0], said[1]


def zero_hz_wav() -> str:
    """A 0 Hz WAV on row 3 of 5."""
    with tempfile.TemporaryDirectory() as folder:
        _pcm(Path(folder) / "zero.wav", 0)
        first, again = _score_audio(Path(folder), {2: "zero.wav"})
    return f"run: {first}; --resume: {again}"


def undecodable_while_scoring() -> str:
    """WAVs replaced after the pre-check (it is skipped): 0 Hz, 33 channels, cut short, on rows
    2-4."""
    with tempfile.TemporaryDirectory() as folder:
        _pcm(Path(folder) / "zero.wav", 0)
        _pcm(Path(folder) / "wide.wav", 16000, channels=33)
        _pcm(Path(folder) / "cut.wav", 16000, cut=True)
        first, again = _score_audio(
            Path(folder), {1: "zero.wav", 2: "wide.wav", 3: "cut.wav"}, unchecked=True
        )
    return f"run: {first}; --resume: {again}"


SCENARIOS = [
    ("OpenRLHF route: 16 MiB of empty objects (item 6)", empty_objects_16mib),
    ("OpenRLHF route: a 50 MB request (item 6)", zeros_label_50mb),
    ("OpenRLHF route: /health while 500,000 values parse (item 6)", half_a_million_values),
    ("OpenRLHF route: nested 5,000 deep (item 6)", nested_deep),
    ("OpenRLHF route: 101 error answers, ERROR lines (item 6)", error_lines),
    ("score: a 0 Hz WAV (item 7)", zero_hz_wav),
    ("score: audio undecodable at scoring time (item 7)", undecodable_while_scoring),
]
