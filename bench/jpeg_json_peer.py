"""A peer design measured in the same run as ours: JPEG + base64 + JSON over HTTP.

A popular RL reward framework sends images to its reward server this way: each image
JPEG-encoded at quality 95, base64 in a JSON body, POSTed; the server decodes JSON,
base64 and JPEG back to uint8 arrays and scores them. The reward here is the mean pixel
/ 255, so scoring costs ~nothing and the figure is the transport. It is lossy: we report
the pixel and reward error next to the time, since our raw-frame codec is exact.

    envs/image/.venv/bin/python -m bench.jpeg_json_peer serve   # prints its port, serves
    measure(images, repeats)                                     # from the trainer env

The server exits when its stdin closes or its parent changes, so it cannot be orphaned.
Imports at module level are stdlib + numpy only (both envs have them).
"""

from __future__ import annotations

import base64
import io
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SERVER_PYTHON = ROOT / "envs" / "image" / ".venv" / "bin" / "python"
STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0


# --- server (scorer env) -------------------------------------------------------------


def _lifeline(expected_ppid: int) -> None:
    """Exit at stdin EOF (the parent closed it or died) or if we are reparented."""
    fd = sys.stdin.fileno()
    while True:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if os.getppid() != expected_ppid or (ready and not os.read(fd, 4096)):
            os._exit(0)


def _decode_jpeg_b64(text: str) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(base64.b64decode(text))) as image:
        return np.asarray(image.convert("RGB"))


def build_app():
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def score(request: Request) -> JSONResponse:
        body = await request.json()
        rewards = {
            item["id"]: float(_decode_jpeg_b64(item["image_jpeg_b64"]).mean() / 255.0)
            for item in body["items"]
        }
        return JSONResponse({"rewards": rewards})

    return Starlette(routes=[Route("/score", score, methods=["POST"])])


def serve() -> None:
    import socket

    import uvicorn

    threading.Thread(target=_lifeline, args=(os.getppid(),), name="lifeline", daemon=True).start()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    config = uvicorn.Config(
        build_app(),
        loop="uvloop",
        http="httptools",
        lifespan="off",
        log_level="warning",
        access_log=False,
    )
    print(sock.getsockname()[1], flush=True)
    uvicorn.Server(config).run(sockets=[sock])


# --- client (trainer env) ------------------------------------------------------------


def _jpeg(array: np.ndarray) -> bytes:
    from PIL import Image  # the trainer env has it: pillow is in the `child` extra

    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def encode_body(images: list[np.ndarray]) -> bytes:
    items = [
        {"id": f"img{i}", "image_jpeg_b64": base64.b64encode(_jpeg(a)).decode("ascii")}
        for i, a in enumerate(images)
    ]
    return json.dumps({"items": items}).encode()


def _read_port(proc: subprocess.Popen[bytes], deadline: float) -> int:
    line = b""
    assert proc.stdout is not None  # started with stdout=PIPE
    fd = proc.stdout.fileno()
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"jpeg_json_peer server gave no port within {STARTUP_TIMEOUT_S}s")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 64)
            if not chunk:
                raise RuntimeError(
                    f"jpeg_json_peer server exited before its port (rc={proc.wait(1)})"
                )
            line += chunk
    return int(line)


def measure(images: list[np.ndarray], repeats: int) -> dict:
    """p50 of encode + POST + server decode + answer, p50 of encode alone, and the JPEG error."""
    import httpx

    exact = [float(a.mean() / 255.0) for a in images]
    roundtrip = _decode_jpeg_b64(base64.b64encode(_jpeg(images[0])).decode())
    max_abs_pixel_error = int(np.abs(roundtrip.astype(np.int16) - images[0].astype(np.int16)).max())

    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [str(SERVER_PYTHON), "-m", "bench.jpeg_json_peer", "serve"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
    )
    try:
        try:
            port = _read_port(proc, time.monotonic() + STARTUP_TIMEOUT_S)
        except Exception:
            log.seek(0)
            sys.stderr.write(log.read()[-4000:].decode(errors="replace"))
            raise
        url = f"http://127.0.0.1:{port}/score"
        totals, encodes, rewards = [], [], {}
        with httpx.Client(trust_env=False, timeout=60.0) as client:
            for i in range(repeats + 1):  # the first is a warm-up (connection, imports)
                t0 = time.perf_counter()
                body = encode_body(images)
                t1 = time.perf_counter()
                response = client.post(
                    url, content=body, headers={"content-type": "application/json"}
                )
                response.raise_for_status()
                rewards = response.json()["rewards"]
                t2 = time.perf_counter()
                if i:
                    encodes.append(t1 - t0)
                    totals.append(t2 - t0)
        got = [rewards[f"img{i}"] for i in range(len(images))]
        return {
            "p50_s": float(np.median(totals)),
            "encode_p50_s": float(np.median(encodes)),
            "body_bytes": len(body),
            "max_abs_pixel_error": max_abs_pixel_error,
            "max_reward_error": float(max(abs(g - e) for g, e in zip(got, exact, strict=True))),
        }
    finally:
        assert proc.stdin is not None and proc.stdout is not None  # started with both pipes
        proc.stdin.close()  # the server's lifeline exits at EOF
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT_S)
        proc.stdout.close()
        log.close()


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        serve()
    else:
        sys.exit("usage: python -m bench.jpeg_json_peer serve")
