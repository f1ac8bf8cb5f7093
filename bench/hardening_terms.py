"""Scenarios of issue 37 items 4 and 11 (a term that times out, crashes, warms up or fails to
close), measured: rows of bench.hardening.

Public API only (and tests/helpers/term_faults.py's models), so the same file measures an older tree
("before") and this one ("now"). Real children, servers and signals; each row says what it measured.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml

from bench.common import readiness, stop
from bench.handles import managed_of, pid_of
from supervisor import (
    ManagedScorerProcessBackend,
    MultiRemoteRewardBackend,
    RemoteRewardBackend,
    RewardItem,
    RewardRequest,
    ScorerError,
    build_panels,
    load_recipe,
)

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ROOT / "tests" / "helpers" / "term_faults.py"
TOKEN = "bench-hardening-terms-token"


def _outcome(call: Callable[[], Any]) -> tuple[str, float]:
    """What a call gave (its error's type, HTTP kind and first words) and its seconds."""
    began = time.monotonic()
    try:
        call()
        said = "served"
    except ScorerError as exc:
        kind = getattr(exc, "kind", None)
        said = f"{type(exc).__name__}" + (f" ({kind})" if kind else "")
    return said, time.monotonic() - began


def _calls(label: str, outcomes: list[tuple[str, float]]) -> str:
    return f"{label}: " + ", ".join(f"{said} {seconds:.2f} s" for said, seconds in outcomes)


def _images(prefix: str, **metadata: Any) -> RewardRequest:
    rng = np.random.default_rng(37)
    items = [
        RewardItem(
            id=f"{prefix}{i}",
            image=rng.integers(0, 256, (8, 6, 3), dtype=np.uint8),
            metadata=dict(metadata),
        )
        for i in range(2)
    ]
    return RewardRequest(items=items)


def _native_recipe(
    model: str, function: str, required: bool = False, **changes: Any
) -> dict[str, Any]:
    """One per-call native model of term_faults in env embed, bound to one function."""
    native = {
        "backend": "native",
        "env": "embed",
        "placement": {"devices": ["cpu"]},
        "executor": {"model": model},
    }
    native.update(extra_import_paths=[str(ROOT)], **changes)
    function_entry = {"path": str(FAULTS), "name": function, "required": required}
    return {"reward": {"models": {"term": native}, "reward_functions": {"term": function_entry}}}


def native_timeout() -> str:
    """Item 4: a native model's sync score function hangs past call_timeout_s=1, then 3 ordinary
    calls."""
    recipe = _native_recipe(
        "pkg://tests.helpers.term_faults:Tiny", "hanging_score", call_timeout_s=1.0, required=True
    )
    train, _ = build_panels(load_recipe(recipe))
    try:
        backend = train.terms[0].backend
        pids = [pid_of(backend)]
        outcomes = [_outcome(lambda: train.compute_rewards(_images("h", hang=True)))]
        for n in range(3):
            outcomes.append(_outcome(partial(train.compute_rewards, _images(f"s{n}"))))
            pids.append(pid_of(backend))
    finally:
        train.close()
    return (
        _calls("call_timeout_s 1, a hang then 3 calls", outcomes)
        + f"; child pids {len(set(pids))} distinct"
    )


def _ff_request(prefix: str, hangs: list[bool]) -> RewardRequest:
    items = [
        RewardItem(id=f"{prefix}{i}", prompt="p" * (i + 1), text="t", metadata={"hang": h})
        for i, h in enumerate(hangs)
    ]
    return RewardRequest(items=items)


def ff_async_timeout() -> str:
    """Item 4: an FF model on 2 async workers (batch_size 1), a call whose 2 chunks hang past
    call_timeout_s=1 (a third queued), then 4 ordinary calls of 2 chunks."""
    params = {
        "model": "tests.helpers.term_faults:Hangs",
        "batch_size": 1,
        "async_reward": True,
        "num_workers": 2,
    }
    spec = {
        "process": {"python_executable": sys.executable, "extra_import_paths": [str(ROOT)]},
        "scorer": {
            "name": "scorers.ff.scorer:FfModelScorer",
            "params": {**params, "call_timeout_s": 1.0},
        },
    }
    with ManagedScorerProcessBackend(spec) as backend:
        pids = [backend.pid]
        outcomes = [
            _outcome(lambda: backend.compute_rewards(_ff_request("h", [True, True, False])))
        ]
        for n in range(4):
            outcomes.append(
                _outcome(partial(backend.compute_rewards, _ff_request(f"s{n}", [False, False])))
            )
            pids.append(backend.pid)
    return _calls("a hang then 4 calls", outcomes) + f"; child pids {len(set(pids))} distinct"


def native_close_raises() -> str:
    """Item 11: a per-call native model whose close() raises after it let go of its weights (an
    optional term): two calls, then the child's residency."""
    recipe = _native_recipe("pkg://tests.helpers.term_faults:ClosesBadly", "hanging_score")
    train, _ = build_panels(load_recipe(recipe))
    try:
        said = []
        for n in range(2):
            try:
                got = train.compute_rewards(_images(f"c{n}"))
                failure = (
                    got.term_failures[0].error.split("(")[1].split(")")[0]
                    if got.term_failures
                    else "none"
                )
                said.append(f"served, term failure '{failure}'")
            except ScorerError as exc:
                said.append(f"{type(exc).__name__} ({getattr(exc, 'kind', None)})")
        residency = managed_of(train.terms[0].backend).health()["residency"]
    finally:
        train.close()
    return f"two calls: {'; '.join(said)}; the child's residency after: {residency}"


def _serve(recipe: Path, ready: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    with open(ready, "w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "supervisor", "serve", "--recipe", str(recipe)],
            stdout=out,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "MANAGED_SCORERS_TOKEN": TOKEN},
        )
    try:
        return server, readiness(ready, server)
    except BaseException:
        stop(server)
        raise


def _term_child(server: int) -> int:
    (child,) = [
        p.pid
        for p in psutil.Process(server).children(recursive=True)
        if "child_runtime" in " ".join(p.cmdline())
    ]
    return child


def _group(pgid: int) -> int:
    count = 0
    for proc in psutil.process_iter(["pid"]):
        try:
            count += os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return count


def served_required_term_crash() -> str:
    """Item 11: two panel servers of one recipe (a required Probe term, max_restarts 0); the term's
    child of the first is SIGKILLed; one call to it alone (no retries), one through both."""
    process = {"python_executable": sys.executable, "extra_import_paths": [str(ROOT)]}
    probe = {
        "kind": "managed",
        "process": process,
        "scorer": {"name": "tests.helpers.fixture_scorers:Probe"},
    }
    probe["restart"] = {"max_restarts": 0}
    request = RewardRequest(items=[RewardItem(id=f"i{i}", text="x" * (i + 1)) for i in range(4)])
    with tempfile.TemporaryDirectory(prefix="bench-terms-") as scratch:
        recipe = Path(scratch) / "reward.yaml"
        recipe.write_text(yaml.safe_dump({"terms": [{"name": "probe", "backend": probe}]}))
        servers = [_serve(recipe, Path(scratch) / f"{name}.json") for name in ("a", "b")]
        try:
            urls = [f"http://127.0.0.1:{info['port']}" for _, info in servers]
            os.kill(_term_child(servers[0][0].pid), signal.SIGKILL)
            time.sleep(0.5)
            with RemoteRewardBackend(urls[0], token=TOKEN, max_retries=0) as alone:
                try:
                    alone.compute_rewards(request)
                    answered = "served"
                except ScorerError as exc:
                    answered = f"HTTP {getattr(exc, 'status', None)} {getattr(exc, 'kind', None)}"
            with MultiRemoteRewardBackend(urls, token=TOKEN, max_retries=0) as both:
                said, seconds = _outcome(lambda: both.compute_rewards(request))
        finally:
            for server, _ in servers:
                stop(server, grace_s=30)
    return f"the server answers {answered}; a client of both servers: {said} in {seconds:.2f} s"


def served_math_warming() -> str:
    """Item 11: serve --recipe with one math_verify term (jobs 1): the math child's process group at
    the readiness line and after a first call."""
    term = {
        "kind": "managed",
        "env": "math",
        "scorer": {"name": "math_verify", "params": {"jobs": 1}},
    }
    request = RewardRequest(items=[RewardItem(id="m", text="\\boxed{4}", reference="4")])
    with tempfile.TemporaryDirectory(prefix="bench-terms-") as scratch:
        recipe = Path(scratch) / "reward.yaml"
        recipe.write_text(yaml.safe_dump({"terms": [{"name": "correct", "backend": term}]}))
        server, info = _serve(recipe, Path(scratch) / "math.json")
        try:
            child = _term_child(server.pid)
            at_ready = _group(child)
            with RemoteRewardBackend(f"http://127.0.0.1:{info['port']}", token=TOKEN) as remote:
                said, seconds = _outcome(lambda: remote.compute_rewards(request))
            after = _group(child)
        finally:
            stop(server, grace_s=30)
    return (
        f"math child's processes at the ready line: {at_ready}, after a first call: {after} "
        f"(first call {said} in {seconds:.2f} s)"
    )


SCENARIOS = [
    ("native model: a call past call_timeout_s (item 4)", native_timeout),
    ("FF async workers: a call past call_timeout_s (item 4)", ff_async_timeout),
    ("served panel: a required term's child killed (item 11)", served_required_term_crash),
    ("served panel: a math term's workers at ready (item 11)", served_math_warming),
    ("native model: close() raises after releasing (item 11)", native_close_raises),
]
