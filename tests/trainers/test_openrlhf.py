"""OpenRLHF's `--reward.remote_url`: the file `managed-scorers integrations openrlhf` prints, loaded
by path and called the way OpenRLHF 0.11.2 calls it (one sample per call, from `asyncio.to_thread`,
many at once), and both routes driven by OpenRLHF's own SingleTurnAgentExecutor in the trainer env
(envs/trl): `serve`'s OpenRLHF route over HTTP and the file. Every reward equals math_verify called
directly in the math env."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from child_runtime.protocol.items import RequestError
from child_runtime.protocol.openrlhf import response_of
from tests.conftest import REPO_ROOT, env_python, wait_until_gone
from tests.ops.test_cli_serve import (
    FLAKY,
    math_env_processes_since,
    start_serve,
    stop_serve,
    wait_ready,
)
from tests.trainers.test_trl_grpo import independent_grades

# What OpenRLHF's SingleTurnAgentExecutor does with a .py remote_url (openrlhf/utils/agent.py).
DRIVER = """
import asyncio, importlib.util, json, sys

spec = importlib.util.spec_from_file_location("reward_func", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
rows = [
    ("so \\\\boxed{10\\\\%}", "0.1"),
    ("\\\\boxed{3}", "4"),
    ("the answer is $\\\\frac{1}{2}$", "0.5"),
] * 16
prompt = "<|im_start|>user what is it?<|im_end|><|im_start|>assistant\\\\n"


async def rollouts():
    calls = [
        asyncio.to_thread(module.reward_func, [prompt + text + "<|im_end|>"], [prompt], [gold])
        for text, gold in rows
    ]
    return await asyncio.gather(*calls, return_exceptions=True)


results = asyncio.run(rollouts())
failed = [repr(r) for r in results if isinstance(r, BaseException)]
if failed:
    print(json.dumps({"failed": failed[:3]}))
    sys.exit(0)
scorer = module.scorer_for()
print(
    json.dumps(
        {
            "rewards": [r["rewards"] for r in results],
            "scores": [r["scores"] for r in results],
            "logs": results[0]["extra_logs"],
            "batches": list(scorer.stream.window_sizes),
            "child": scorer.panel.terms[0].backend.pid,
        }
    )
)
"""


def run_driver(tmp_path, models: dict) -> subprocess.CompletedProcess[str]:
    recipe = tmp_path / "reward.yaml"
    functions = {name: {"model": name} for name in models}
    recipe.write_text(json.dumps({"reward": {"models": models, "reward_functions": functions}}))
    where = subprocess.run(
        [sys.executable, "-m", "supervisor", "integrations", "openrlhf"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # this checkout's packages, whatever an installed copy says (the driver runs in tmp_path)
    env = {**os.environ, "MANAGED_SCORERS_RECIPE": str(recipe), "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-c", DRIVER, where],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.slow
def test_one_sample_calls_from_threads_are_coalesced_and_graded_by_the_math_child(tmp_path):
    math = {"backend": "managed", "scorer": "math_verify", "env": "math", "params": {"jobs": 2}}
    done = run_driver(tmp_path, {"correct": math})
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert "failed" not in report, report
    # 10\\\\% is 0.1 (antlr 4.13.2)
    assert report["rewards"] == report["scores"] == [1.0, 0.0, 1.0] * 16
    assert report["logs"] == {"correct": 1.0}
    # batched, not one request per sample
    assert sum(report["batches"]) == 48 and len(report["batches"]) < 48
    assert wait_until_gone([report["child"]], 10) == []  # closed at exit


def test_a_groupwise_term_is_refused_loudly_when_the_function_starts(tmp_path):
    done = run_driver(
        tmp_path,
        {
            "judge": {
                "backend": "local",
                "scorer": "pairwise_judge",
                "params": {"inner": "token_f1"},
            }
        },
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert "no group id" in report["failed"][0] and "ConfigError" in report["failed"][0]
    # OpenRLHF logs it at INFO only: we at ERROR
    assert "managed-scorers reward_func failed" in done.stderr


def test_a_per_candidate_rule_is_taken_one_sample_at_a_time(tmp_path):
    """format_reward is groupwise by its lifting (map_candidates) but scores each sample on its
    own: OpenRLHF's one sample per call, without a group id, takes it."""
    from supervisor import RewardItem
    from supervisor.adapters.openrlhf import _Scorer

    rule = {"backend": "local", "scorer": "format_reward", "params": {"pattern": "<answer>.*"}}
    recipe = tmp_path / "reward.yaml"
    recipe.write_text(
        json.dumps(
            {"reward": {"models": {"fmt": rule}, "reward_functions": {"fmt": {"model": "fmt"}}}}
        )
    )
    scorer = _Scorer(str(recipe))
    try:
        rows = scorer.score(
            [RewardItem(id="a", text="<answer>1", group_id="g"), RewardItem(id="b", text="1")]
        )
    finally:
        scorer.close()
    assert [row["reward"] for row in rows] == [1.0, 0.0]


def test_the_response_is_the_query_less_its_prompt_and_the_special_tokens_at_its_ends():
    prompt = "<|im_start|>user Q<|im_end|><|im_start|>assistant"
    assert response_of(prompt + " so \\boxed{3}<|im_end|></s>", prompt) == "so \\boxed{3}"
    # only tokens, only at the ends
    assert response_of("Q: 1+1? A: <b>2</b></s><pad><pad>", "Q: 1+1?") == "A: <b>2</b>"
    # the prompt found inside the query
    assert response_of("<s>sys</s>Q: x? 7<|endoftext|>", "Q: x?") == "7"
    with pytest.raises(RequestError, match="does not contain its prompt"):
        response_of("something else", "Q: x?")


EXECUTOR = REPO_ROOT / "tests" / "helpers" / "openrlhf_executor.py"
CASES = [("so \\boxed{10\\%}", "0.1"), ("\\boxed{3}", "4"), ("the answer is $\\frac{1}{2}$", "0.5")]
ROWS = [
    [f"<|im_start|>user\nProblem {n}: solve it.<|im_end|>\n<|im_start|>assistant\n", text, gold]
    for n, (text, gold) in enumerate(CASES * 3)
]
BURST = [[f"<|im_start|>user\nBurst {n}<|im_end|>\n", "x" * (n % 7), None] for n in range(400)]
BEARER = {"authorization": "Bearer " + "t" * 32}
# 10\\% is 0.1 under the math env's antlr 4.13.2, not the trainer env's 4.9.3
EXPECTED = [1.0, 0.0, 1.0] * 3


def run_executor(tmp_path: Path, jobs: list[dict], env: dict[str, str]) -> tuple[dict, str]:
    """OpenRLHF's executor in the trainer env, one per job, all at once; its report and its log."""
    plan, report = tmp_path / "plan.json", tmp_path / "report.json"
    plan.write_text(json.dumps({"jobs": jobs}))
    done = subprocess.run(
        [str(env_python("trl")), str(EXECUTOR), str(plan), str(report)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(report.read_text()), done.stdout + done.stderr


def check_graded(outputs: list[dict], rows: list[list]) -> None:
    rewards = [out["reward"] for out in outputs]
    assert (
        rewards
        == independent_grades([text for _, text, _ in rows], [gold for _, _, gold in rows])
        == EXPECTED
    )
    assert [out["scores"] for out in outputs] == rewards
    assert [out["extra_logs"] for out in outputs] == [{"math_verify": r} for r in rewards]


def openrlhf_answers(port: int) -> int:
    page = httpx.get(f"http://127.0.0.1:{port}/metrics", headers=BEARER, timeout=10)
    key = 'endpoint="/openrlhf",status="200"}'
    return sum(int(line.rsplit(" ", 1)[1]) for line in page.text.splitlines() if key in line)


@pytest.mark.slow
def test_openrlhfs_executor_scores_through_serve_on_two_urls_and_loses_nothing_silently(tmp_path):
    start = time.time() - 1
    secret_file = tmp_path / "openrlhf-secret"
    route = ["--openrlhf-secret-file", str(secret_file)]
    math = ["--scorer", "math_verify", "--env", "math", "--params", '{"jobs": 1}', *route]
    servers = [start_serve(tmp_path, f"math{n}", *math) for n in range(2)] + [
        start_serve(tmp_path, "flaky", *FLAKY, *route)
    ]
    try:
        ports = [wait_ready(ready)["port"] for _, ready, _ in servers]
        secret = secret_file.read_text().strip()
        urls = [f"http://127.0.0.1:{port}/openrlhf/{secret}" for port in ports]
        flaky_rows = [
            ["<|im_start|>user\nA<|im_end|>\n", "raise", None],
            ["<|im_start|>user\nB<|im_end|>\n", "four", None],
        ]
        jobs = [
            # two serve processes: OpenRLHF rotates its calls
            {"remote_url": ",".join(urls[:2]), "rows": ROWS},
            {
                "remote_url": f"http://127.0.0.1:{ports[0]}/openrlhf/{secret[::-1]}",
                "rows": ROWS[:2],
            },
            {"remote_url": urls[2], "rows": flaky_rows},
            # at once: more than 64 pending connections x 5 tries
            {"remote_url": urls[2], "rows": BURST},
        ]
        report, openrlhf_log = run_executor(
            tmp_path, jobs, {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        )
        assert report["antlr"] == "4.9.3"  # the trainer env's: it grades 10\\% wrong in-process
        check_graded(report["jobs"][0], ROWS)
        answered = [openrlhf_answers(port) for port in ports[:2]]
        # both URLs used, each sample once
        assert min(answered) > 0 and sum(answered) == len(ROWS), answered
        # a wrong secret: 401, five times
        assert [out["reward"] for out in report["jobs"][1]] == [None, None]
        # a scorer failure: 500, five times
        assert [out["reward"] for out in report["jobs"][2]] == [None, 4.0]
        assert [out["reward"] for out in report["jobs"][3]] == [
            float(len(text)) for _, text, _ in BURST
        ]
        flaky_health = httpx.get(
            f"http://127.0.0.1:{ports[2]}/health", headers=BEARER, timeout=10
        ).json()
        # the burst was let wait, not turned away
        assert flaky_health["connections"]["evicted"] == 0
        # OpenRLHF's own word on it, at INFO
        assert "Failed to fetch reward from remote RM" in openrlhf_log
        assert [stop_serve(server) for server, _, _ in servers] == [0, 0, 0]
    finally:
        for server, _, _ in servers:
            if server.poll() is None:
                server.kill()
                server.wait()
    assert " WARNING child_runtime.openrlhf: 401 for 1 request(s)" in servers[0][2].read_text()
    flaky_log = servers[2][2].read_text()
    # OpenRLHF's five tries, 1 s apart: one line at once, the rest counted in the next line (10 s
    # later)
    assert flaky_log.count(" ERROR child_runtime.openrlhf: answered 500 scorer_error x1 (") == 1
    assert "ZeroDivisionError: scorer bug on cue" in flaky_log
    # the servers' graders went with them
    assert wait_until_gone(math_env_processes_since(start), 10) == []


@pytest.mark.slow
def test_openrlhfs_executor_scores_through_the_shipped_reward_func_file(tmp_path):
    start = time.time() - 1
    recipe = tmp_path / "reward.yaml"
    math = {"backend": "managed", "scorer": "math_verify", "env": "math", "params": {"jobs": 2}}
    recipe.write_text(
        json.dumps(
            {
                "reward": {
                    "models": {"math_verify": math},
                    "reward_functions": {"math_verify": {"model": "math_verify"}},
                }
            }
        )
    )
    where = subprocess.run(
        [sys.executable, "-m", "supervisor", "integrations", "openrlhf"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # this checkout's code
    env = {**os.environ, "MANAGED_SCORERS_RECIPE": str(recipe), "PYTHONPATH": str(REPO_ROOT)}
    report, _ = run_executor(tmp_path, [{"remote_url": where, "rows": ROWS}], env)
    check_graded(report["jobs"][0], ROWS)
    # the file's child closed at exit
    assert wait_until_gone(math_env_processes_since(start), 10) == []
