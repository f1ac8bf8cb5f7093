"""verl-omni engine models: what owning an engine process costs, on this machine's CPU.

`python -m bench.engine` (and a line of `make bench`): a tiny model (built offline by
tests/helpers/engine_models.py) served by `transformers serve` from env engine, behind a managed
child, with one router-based reward function. It reports spawn-to-ready (the backend built: the
child up, the engine started, answering and listing the model), wake and sleep times (restart
mode: `transformers serve` has no sleep endpoints, so sleep stops the engine and wake starts it),
the RSS of the engine's tree awake and asleep, and an offloaded call (wake + score + sleep) against
a resident one, same run, rewards asserted equal. `gpu_residency` reuses `engine_backend` on CUDA.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import both, start_all
from supervisor import RewardItem, RewardRequest, RewardResponse, build_panels, load_recipe
from supervisor.compose.panel import RewardPanel

ROOT = Path(__file__).resolve().parent.parent
HELPER = ROOT / "tests" / "helpers" / "engine_models.py"
ENGINE_PYTHON = ROOT / "envs" / "engine" / ".venv" / "bin" / "python"
SERVE = "{python} -m transformers.cli.transformers serve {model_path} --device {device}"
SERVE += " --host 127.0.0.1 --port {port}"
MIB = 2**20


def build_model(python: Path, out: Path, env: dict[str, str] | None = None) -> None:
    """The tiny model, built by `python` (which has transformers) into `out`."""
    cases = out.parent / "cases.json"
    cases.write_text(json.dumps([{"brightness": 1.0, "prompt": "yes"}]))
    subprocess.run(
        [str(python), str(HELPER), str(out), str(cases)],
        check=True,
        capture_output=True,
        timeout=300,
        env=env,
    )


def engine_backend(
    model: Path,
    offload: bool,
    device: str = "cpu",
    python: Path | None = None,
    site: Path | None = None,
) -> RewardPanel:
    """A one-term panel: the engine model `model` and the seed's router-based function, in env
    engine, or run by `python` with `site` on its path (the child's and the engine's)."""
    where: dict[str, Any] = {}
    if python is not None:
        where["python_executable"] = str(python)
    if site is not None:
        where.update(extra_import_paths=[str(site)], engine_env={"PYTHONPATH": str(site)})
    recipe = {
        "reward": {
            "models": {
                "judge": {
                    "backend": "engine",
                    "device": device,
                    "model_path": str(model),
                    "command": SERVE,
                    "offload": offload,
                    "ready_timeout_s": 240,
                    **where,
                }
            },
            "reward_functions": {
                "judge": {"path": str(HELPER), "name": "compute_score", "required": True}
            },
        }
    }
    if device != "cpu":  # one GPU: the engine takes index 0
        recipe["reward"]["models"]["judge"]["n_gpus_per_node"] = 1
    train, _ = build_panels(load_recipe(recipe))
    return train


def request(count: int = 4) -> RewardRequest:
    rng = np.random.default_rng(3)
    return RewardRequest(
        items=[
            RewardItem(
                id=f"e{i}",
                image=rng.integers(0, 256, (8, 8, 3), dtype=np.uint8),
                reference="a good cat",
                data_source="d",
            )
            for i in range(count)
        ]
    )


def engine_tree_rss(model: Path) -> int:
    """RSS of every live process whose command line serves `model` (the keeper and the engine)."""
    import psutil

    total = 0
    for proc in psutil.process_iter(["cmdline", "memory_info"]):
        if str(model) in (proc.info["cmdline"] or []) and proc.info["memory_info"] is not None:
            total += proc.info["memory_info"].rss
    return total


def main_line(rounds: int = 3, together: bool = False) -> str:
    """`together` (the smoke run's): the two engines started at once, and each round's two calls
    made at once; every figure then counts the other engine's load, every check stays."""

    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
        model = Path(tmp) / "model"
        build_model(ENGINE_PYTHON, model)
        shutil.copytree(model, Path(tmp) / "resident")  # its own path: its own processes
        ready: list[float] = []

        def offloaded_backend() -> RewardPanel:
            began = time.perf_counter()
            panel = engine_backend(model, offload=True)
            ready.append(time.perf_counter() - began)
            return panel

        offloaded, resident = start_all(
            [offloaded_backend, lambda: engine_backend(Path(tmp) / "resident", offload=False)],
            together,
        )
        try:
            return _measure(model, offloaded, resident, ready[0], rounds, together)
        finally:
            offloaded.close()
            resident.close()


def _timed_call(panel: RewardPanel) -> tuple[float, RewardResponse]:
    began = time.perf_counter()
    answer = panel.compute_rewards(request())
    return time.perf_counter() - began, answer


def _round(
    offloaded: RewardPanel, resident: RewardPanel, together: bool
) -> dict[str, tuple[float, RewardResponse]]:
    """Each panel's call, one after the other or both at once."""
    got = both(partial(_timed_call, offloaded), partial(_timed_call, resident), together)
    return dict(zip(("offload", "resident"), got, strict=True))


def _measure(
    model: Path,
    offloaded: RewardPanel,
    resident: RewardPanel,
    ready: float,
    rounds: int,
    together: bool,
) -> str:
    times: dict[str, list[float]] = {"offload": [], "resident": []}
    rewards: dict[str, list[list[float]]] = {"offload": [], "resident": []}
    wake, sleep, awake_rss = [], [], []
    for _ in range(rounds):
        got = _round(offloaded, resident, together)
        for name, (seconds, answer) in got.items():
            times[name].append(seconds)
            rewards[name].append(list(answer.rewards))
        values = got["offload"][1].diagnostics["judge"]["values"]
        wake.append(values.get("engine_wake_s", {}).get("sum", 0.0))
        sleep.append(values.get("engine_sleep_s", {}).get("sum", 0.0))
        awake_rss.append(values["engine_rss_bytes"]["sum"])
    assert rewards["offload"] == rewards["resident"], "offloaded and resident rewards differ"
    asleep = engine_tree_rss(model)  # the offloaded engine's, between calls
    p_off, p_res = (statistics.median(times[k]) for k in ("offload", "resident"))
    return (
        f"engine (transformers serve, cpu): spawn-to-ready {ready:.1f} s; wake p50 "
        f"{statistics.median(wake):.1f} s, sleep p50 {statistics.median(sleep) * 1e3:.0f} ms "
        f"(restart mode); engine tree RSS awake {statistics.median(awake_rss) / MIB:.0f} MiB, "
        f"asleep {asleep / MIB:.0f} MiB; offloaded call {p_off:.2f} s vs resident "
        f"{p_res * 1e3:.0f} ms (ratio {p_off / p_res:.0f}x), same rewards"
    )


if __name__ == "__main__":
    print(main_line(int(sys.argv[1]) if len(sys.argv) > 1 else 3))
