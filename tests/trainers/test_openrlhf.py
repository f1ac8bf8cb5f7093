"""OpenRLHF's `--reward.remote_url <file>`: the file `managed-scorers integrations openrlhf` prints, loaded by
path and called the way OpenRLHF 0.11.2 calls it: one sample per call, from `asyncio.to_thread`, many at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from child_runtime.protocol.items import RequestError
from child_runtime.protocol.openrlhf import response_of
from tests.conftest import REPO_ROOT, wait_until_gone

# What OpenRLHF's SingleTurnAgentExecutor does with a .py remote_url (openrlhf/utils/agent.py).
DRIVER = """
import asyncio, importlib.util, json, sys
spec = importlib.util.spec_from_file_location("reward_func", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
rows = [("so \\\\boxed{10\\\\%}", "0.1"), ("\\\\boxed{3}", "4"), ("the answer is $\\\\frac{1}{2}$", "0.5")] * 16
prompt = "<|im_start|>user what is it?<|im_end|><|im_start|>assistant\\\\n"

async def rollouts():
    calls = [asyncio.to_thread(module.reward_func, [prompt + text + "<|im_end|>"], [prompt], [gold]) for text, gold in rows]
    return await asyncio.gather(*calls, return_exceptions=True)

results = asyncio.run(rollouts())
failed = [repr(r) for r in results if isinstance(r, BaseException)]
if failed:
    print(json.dumps({"failed": failed[:3]}))
    sys.exit(0)
scorer = module.scorer_for()
print(json.dumps({"rewards": [r["rewards"] for r in results], "scores": [r["scores"] for r in results],
                  "logs": results[0]["extra_logs"], "batches": list(scorer.coalescer.batch_sizes),
                  "child": scorer.panel.terms[0].backend.pid}))
"""


def run_driver(tmp_path, models: dict) -> subprocess.CompletedProcess[str]:
    recipe = tmp_path / "reward.yaml"
    functions = {name: {"model": name} for name in models}
    recipe.write_text(json.dumps({"reward": {"models": models, "reward_functions": functions}}))
    where = subprocess.run(
        [sys.executable, "-m", "supervisor", "integrations", "openrlhf"], capture_output=True, text=True, check=True
    ).stdout.strip()
    # this checkout's packages, whatever an installed copy says (the driver runs in tmp_path)
    env = {**os.environ, "MANAGED_SCORERS_RECIPE": str(recipe), "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-c", DRIVER, where], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )


@pytest.mark.slow
def test_one_sample_calls_from_threads_are_coalesced_and_graded_by_the_math_child(tmp_path):
    math = {"backend": "managed", "scorer": "math_verify", "env": "math", "params": {"jobs": 2}}
    done = run_driver(tmp_path, {"correct": math})
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert "failed" not in report, report
    assert report["rewards"] == report["scores"] == [1.0, 0.0, 1.0] * 16  # 10\\\\% is 0.1 (antlr 4.13.2)
    assert report["logs"] == {"correct": 1.0}
    assert sum(report["batches"]) == 48 and len(report["batches"]) < 48  # batched, not one request per sample
    assert wait_until_gone([report["child"]], 10) == []  # closed at exit


def test_a_groupwise_term_is_refused_loudly_when_the_function_starts(tmp_path):
    done = run_driver(
        tmp_path, {"judge": {"backend": "local", "scorer": "pairwise_judge", "params": {"inner": "token_f1"}}}
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert "no group id" in report["failed"][0] and "ConfigError" in report["failed"][0]
    assert "managed-scorers reward_func failed" in done.stderr  # OpenRLHF logs it at INFO only: we at ERROR


def test_the_response_is_the_query_less_its_prompt_and_the_special_tokens_at_its_ends():
    prompt = "<|im_start|>user Q<|im_end|><|im_start|>assistant"
    assert response_of(prompt + " so \\boxed{3}<|im_end|></s>", prompt) == "so \\boxed{3}"
    assert response_of("Q: 1+1? A: <b>2</b></s><pad><pad>", "Q: 1+1?") == "A: <b>2</b>"  # only tokens, only at the ends
    assert response_of("<s>sys</s>Q: x? 7<|endoftext|>", "Q: x?") == "7"  # the prompt found inside the query
    with pytest.raises(RequestError, match="does not contain its prompt"):
        response_of("something else", "Q: x?")
