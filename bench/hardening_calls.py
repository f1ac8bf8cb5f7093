"""Scenarios of issue 24 (a whole call's bounds, panels, the score CLI), measured: rows of
bench.hardening.

Public API only, so the same file measures an older tree ("before") and this one ("now").
Real children, servers, signals and CLI runs; each row says what it measured.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import PeakMemory
from bench.handles import child_of, port_of
from bench.misbehaving_server import MisbehavingServer
from bench.workloads import PATHOLOGICAL, slices, with_hazards
from supervisor import (
    LocalRewardBackend,
    ManagedScorerProcessBackend,
    PanelTerm,
    RewardItem,
    RewardPanel,
    RewardRequest,
    ScorerError,
)

ROOT = Path(__file__).resolve().parent.parent
TRAINER = sys.executable
MATH = str(ROOT / "envs" / "math" / ".venv" / "bin" / "python")
CLIENT = """
import json, resource, sys, time
from supervisor import RemoteRewardBackend, RewardItem, RewardRequest

url, token, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
remote = RemoteRewardBackend(url, token=token, request_timeout=timeout)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
began = time.monotonic()
try:
    remote.compute_rewards(
        RewardRequest(items=[RewardItem(id=f"r{i}", text="x" * i) for i in range(5)])
    )
    outcome = "scored"
except Exception as exc:
    first = str(exc).splitlines()[0]
    outcome = (
        f"{type(exc).__name__}: ...{first[-90:]}"
        if len(first) > 90
        else f"{type(exc).__name__}: {first}"
    )
print(
    json.dumps(
        {
            "s": time.monotonic() - began,
            "outcome": outcome,
            "rss": [before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss],
        }
    )
)
"""


def _spec(name: str, python: str = TRAINER, **spec: object) -> dict:
    process = {
        "python_executable": python,
        "extra_import_paths": [str(ROOT)],
        **spec.pop("process", {}),  # type: ignore[dict-item]
    }
    return {"process": process, "scorer": {"name": name, **spec.pop("scorer", {})}, **spec}  # type: ignore[dict-item]


def _remote_client(url: str, token: str, timeout: float) -> dict:
    done = subprocess.run(
        [TRAINER, "-c", CLIENT, url, token, str(timeout)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.splitlines()[-1])


def remote_trickle() -> str:
    """Item 1: a server that sends a valid answer a byte every 50 ms, request_timeout=2."""
    with ManagedScorerProcessBackend(_spec("tests.helpers.fixture_scorers:Probe")) as server:
        with MisbehavingServer(
            f"http://127.0.0.1:{port_of(server)}", "trickle", trickle_s=0.05
        ) as slow:
            got = _remote_client(slow.url, child_of(server).token, 2.0)
    return (
        f"request_timeout 2 s, a valid answer trickled a byte every 50 ms: {got['outcome']} "
        f"after {got['s']:.1f} s"
    )


def remote_gzip_bomb() -> str:
    """Item 1: a 512 MiB gzip bomb answer (about 520 KB on the wire)."""
    with ManagedScorerProcessBackend(_spec("tests.helpers.fixture_scorers:Probe")) as server:
        with MisbehavingServer(
            f"http://127.0.0.1:{port_of(server)}", "gzip_bomb", gzip_mib=512
        ) as bomb:
            got = _remote_client(bomb.url, child_of(server).token, 60.0)
    before, after = (kib / 2**10 for kib in got["rss"])
    return (
        f"{len(bomb.bomb) / 2**10:.0f} KB of gzip that decodes to 512 MiB: {got['outcome']} "
        f"after {got['s']:.2f} s; trainer peak RSS {before:.0f} -> {after:.0f} MiB"
    )


def hostile_tail_default_config(
    ordinary: int = 512,
    timeout_s: float = 5,
    hazards: int = len(PATHOLOGICAL),
    generation_s: float = 1.5,
) -> str:
    """Items 3 and 9: 512 + 8 pathological items through a managed math child, default client
    config. `generation_s`: the idle wait before each timed call, as a trainer generates (the
    child's template replays meanwhile; the smoke run's: none, as bench.hostile_math's)."""
    spec = _spec(
        "math_verify",
        MATH,
        scorer={"params": {"jobs": 2, "timeout_s": timeout_s}},
        client={"input_kind": "text"},
    )
    fresh = slices(ordinary)

    def request(tasks: list[tuple]) -> RewardRequest:
        return RewardRequest(
            items=[RewardItem(id=str(i), text=t[0], reference=t[1]) for i, t in enumerate(tasks)]
        )

    with ManagedScorerProcessBackend(spec) as backend:
        assert backend.pid is not None
        backend.compute_rewards(request(next(fresh)))
        time.sleep(generation_s)
        began = time.monotonic()
        backend.compute_rewards(request(next(fresh)))
        clean_s = time.monotonic() - began
        time.sleep(generation_s)
        with PeakMemory(backend.pid) as memory:
            began = time.monotonic()
            backend.compute_rewards(request(with_hazards(next(fresh), hazards)[0]))
            hostile_s = time.monotonic() - began
    return (
        f"request_batch_size 64 ({-(-(ordinary + hazards) // 64)} chunks), timeout_s "
        f"{timeout_s:g}: clean {clean_s:.2f} s, hostile "
        f"{hostile_s:.2f} s (+{hostile_s - clean_s:.2f} s); the child's tree peaked at "
        f"{memory.peak_pss / 2**30:.2f} GiB PSS ({memory.peak_rss / 2**30:.2f} summed RSS)"
    )


def panel_shared_timeout() -> str:
    """Item 4: a required and an optional term on one child that hangs (request_timeout 2 s)."""
    shared = ManagedScorerProcessBackend(
        _spec("tests.helpers.fixture_scorers:Flaky", process={"request_timeout": 2})
    )
    terms = [
        PanelTerm("chat", shared, applicable_datasets=["chat"]),
        PanelTerm("code", shared, applicable_datasets=["code"], required=False),
    ]
    request = RewardRequest(
        items=[
            RewardItem(id="h0", text="slow", data_source="chat"),
            RewardItem(id="c0", text="c0", data_source="code"),
        ]
    )
    with shared, RewardPanel(terms, owns_backends=False) as panel:
        began = time.monotonic()
        try:
            panel.compute_rewards(request)
            outcome = "scored?"
        except ScorerError as exc:
            outcome = type(exc).__name__
        took = time.monotonic() - began
        return (
            f"{outcome} after {took:.1f} s; the child was restarted {shared.restarts} time(s) "
            f"within the call"
        )


def ctrl_c_submit() -> str:
    """Item 5: SIGINT while the trainer waits in submit().result() (shutdown_timeout 10 s)."""
    trainer = subprocess.Popen(
        [TRAINER, "-m", "tests.helpers.interrupted_trainer", TRAINER, "--via", "submit"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert trainer.stdout is not None and trainer.stderr is not None
    json.loads(trainer.stdout.readline())
    began = time.monotonic()
    trainer.send_signal(signal.SIGINT)
    trainer.wait(30)
    took = time.monotonic() - began
    trainer.stdout.close()
    trainer.stderr.close()
    return f"trainer exited {took:.2f} s after SIGINT"


def _score(
    folder: Path, recipe: dict, rows: list[dict], *extra: str
) -> subprocess.CompletedProcess[str]:
    (folder / "r.json").write_text(json.dumps({"reward": recipe}))
    (folder / "in.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    command = [TRAINER, "-m", "supervisor", "score", "--recipe", str(folder / "r.json")]
    command += ["--input", str(folder / "in.jsonl"), "--output", str(folder / "out.jsonl"), *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def score_optional_failure() -> str:
    """Item 6: `score` with an optional term that fails for every row."""
    with tempfile.TemporaryDirectory() as folder:
        models = {
            "len": {"backend": "local", "scorer": "tests.helpers.fixture_scorers:Probe"},
            "picky": {"backend": "local", "scorer": "tests.helpers.fixture_scorers:RefusesText"},
        }
        functions = {"len": {"model": "len"}, "picky": {"model": "picky", "required": False}}
        rows = [{"id": f"t{i}", "response": text} for i, text in enumerate(["a", "poison", "ccc"])]
        done = _score(Path(folder), {"models": models, "reward_functions": functions}, rows)
        first = json.loads((Path(folder) / "out.jsonl").read_text().splitlines()[0])
    summary = next((line for line in done.stderr.splitlines() if "rows scored" in line), "?").split(
        ": ", 1
    )[-1][:90]
    return (
        f"exit {done.returncode}; '{summary}'; a row: "
        f"{json.dumps({k: first.get(k) for k in ('components', 'failed_terms', 'error')})}"
    )


def group_partial_optional() -> str:
    """Item 7: an optional term fails on one member of a GRPO group of 4."""
    items = [
        RewardItem(id=f"g-{m}", text="fail" if m == 1 else f"ok{m}", group_id="g") for m in range(4)
    ]
    terms = [
        PanelTerm("base", LocalRewardBackend("constant")),
        PanelTerm(
            "judge", LocalRewardBackend("tests.helpers.fixture_scorers:FailsMarked"), required=False
        ),
    ]
    with RewardPanel(terms) as panel:
        response = panel.compute_rewards(RewardRequest(items=items, group_size=4))
    return f"rewards {response.rewards}, judge failed for {[f.ids for f in response.term_failures]}"


def score_truncated_image() -> str:
    """Item 8: a PNG cut in half among four rows, then --resume."""
    import numpy as np
    from PIL import Image

    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        Image.fromarray(np.full((64, 64, 3), 90, np.uint8)).save(folder / "ok.png")
        whole = (folder / "ok.png").read_bytes()
        (folder / "cut.png").write_bytes(whole[: len(whole) // 2])
        recipe = {
            "models": {
                "m": {"backend": "local", "scorer": "mean_intensity", "input_kind": "image"}
            },
            "reward_functions": {"t": {"model": "m"}},
        }
        rows = [{"id": f"r{i}", "image": "cut.png" if i == 1 else "ok.png"} for i in range(4)]
        first = _score(folder, recipe, rows, "--image-column", "image")
        again = _score(folder, recipe, rows, "--image-column", "image", "--resume")
        written = (
            len((folder / "out.jsonl").read_text().splitlines())
            if (folder / "out.jsonl").exists()
            else 0
        )
    crash = "traceback" if "Traceback" in first.stderr else "no traceback"
    return (
        f"first run exit {first.returncode} ({crash}), --resume exit {again.returncode}; "
        f"{written} of 4 rows written"
    )


def two_runs_one_output() -> str:
    """Item 10: a second `score` on the output a running one writes (each row takes 0.3 s)."""
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        models = {
            "m": {
                "backend": "local",
                "scorer": "tests.helpers.fixture_scorers:Probe",
                "params": {"sleep_s": 0.3},
            }
        }
        recipe = {"models": models, "reward_functions": {"t": {"model": "m"}}}
        (folder / "r.json").write_text(json.dumps({"reward": recipe}))
        (folder / "in.jsonl").write_text(
            "".join(json.dumps({"id": f"t{i}", "response": "x" * i}) + "\n" for i in range(8))
        )
        command = [TRAINER, "-m", "supervisor", "score", "--recipe", str(folder / "r.json")]
        command += [
            "--input",
            str(folder / "in.jsonl"),
            "--output",
            str(folder / "out.jsonl"),
            "--batch-size",
            "1",
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        first = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 60
        while (
            not (folder / "out.jsonl").exists()
            or (folder / "out.jsonl").read_text().count("\n") < 1
        ):
            if time.monotonic() > deadline:
                raise RuntimeError("the first run wrote nothing")
            time.sleep(0.02)
        second = subprocess.run(
            [*command, "--resume"], env=env, capture_output=True, text=True, timeout=120
        )
        first.wait(120)
        rows = [json.loads(line)["id"] for line in (folder / "out.jsonl").read_text().splitlines()]
    return (
        f"second run (--resume) exit {second.returncode}, first exit {first.returncode}; the "
        f"output holds {len(rows)} rows for 8 inputs ({len(set(rows))} distinct)"
    )


SCENARIOS = [
    ("remote: trickled answer (item 1)", remote_trickle),
    ("remote: gzip bomb (item 1)", remote_gzip_bomb),
    ("hostile tail, default chunking; tree memory (items 3, 9)", hostile_tail_default_config),
    ("panel: shared call times out (item 4)", panel_shared_timeout),
    ("Ctrl-C in submit().result() (item 5)", ctrl_c_submit),
    ("score: optional term fails (item 6)", score_optional_failure),
    ("panel: optional term fails on 1 of a group (item 7)", group_partial_optional),
    ("score: truncated PNG (item 8)", score_truncated_image),
    ("score: two runs on one output (item 10)", two_runs_one_output),
]
