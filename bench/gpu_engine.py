"""The GPU check's engine rows: a verl-omni engine model on the check's device, and what its sleep
gives back.

`transformers serve --device cuda` (what a bare CUDA machine can run once transformers[serving]
travels: in bench/gpu_wheels.txt) serves the tiny model of tests/helpers/engine_models.py
behind a managed child. Rows: spawn-to-ready; the device memory the engine holds awake (a resident
engine, after a call) and asleep (an offloaded one between calls: restart mode stops the engine,
so all of it must come back); wake and sleep seconds. vLLM's sleep endpoints are not exercised:
no vLLM runs on the machines this project tests on.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.engine import build_model, engine_backend, engine_tree_rss, request

MIB = 2**20
FREED_SLACK = 64 * MIB  # asleep: within this of the floor before the engine started


def importable(python: Path, env: dict[str, str]) -> str | None:
    """None if `python` can run `transformers serve`, else why not."""
    done = subprocess.run(
        [str(python), "-c", "import transformers.cli.serve, fastapi, openai"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[-1]


def engine_rows(
    row: Callable[..., None],
    python: Path,
    site: Path | None,
    device: str,
    used: Callable[[], int] | None,
) -> None:
    """Print the engine rows through `row(what, figure, verdict, failed=...)`."""
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    missing = importable(python, env)
    if missing is not None:
        row(
            "engine model (transformers serve)", "skipped", f"not importable by {python}: {missing}"
        )
        return
    with tempfile.TemporaryDirectory(prefix="gpu-engine-") as tmp:
        model = Path(tmp) / "model"
        build_model(python, model, env)
        base = used() if used else 0
        began = time.perf_counter()
        resident = engine_backend(model, offload=False, device=device, python=python, site=site)
        row(
            "engine: spawn-to-ready (child, engine, model listed)",
            f"{time.perf_counter() - began:.1f} s",
        )
        try:
            resident.compute_rewards(request())
            awake = used() - base if used else engine_tree_rss(model)
        finally:
            resident.close()
        offloaded = engine_backend(model, offload=True, device=device, python=python, site=site)
        try:
            answer = offloaded.compute_rewards(request())
            offloaded.compute_rewards(request())
            asleep = used() - base if used else engine_tree_rss(model)
            values = answer.diagnostics["judge"]["values"]
        finally:
            offloaded.close()
    unit = "device used" if used else "engine tree RSS"
    freed = asleep <= FREED_SLACK
    row(
        f"engine: {unit} awake / asleep (restart mode)",
        f"{awake / MIB:.0f} / {asleep / MIB:.0f} MiB",
        "freed" if freed else "held while asleep",
        failed=not freed,
    )
    row(
        "engine: wake / sleep",
        f"{values.get('engine_wake_s', {}).get('sum', 0.0):.1f} s / "
        f"{values.get('engine_sleep_s', {}).get('sum', 0.0) * 1e3:.0f} ms",
    )
