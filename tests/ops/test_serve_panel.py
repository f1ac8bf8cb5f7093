"""`managed-scorers serve --recipe`: a whole panel behind one server, scored through
RemoteRewardBackend as the same panel scores in-process; real processes and sockets."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest
import yaml

from supervisor import RemoteRewardBackend, RewardItem, RewardPanel, RewardRequest
from supervisor.compose.recipes import build_panel, load_recipe
from supervisor.errors import ConfigError, ScorerRequestError
from tests.conftest import REPO_ROOT, group_members, wait_until_gone
from tests.ops.test_cli_serve import start_serve, stop_serve, wait_ready

TOKEN = "t" * 32  # start_serve's
RECIPE = {
    "terms": [
        {
            "name": "correct",
            "weight": 1.0,
            "backend": {
                "kind": "managed",
                "env": "math",
                "scorer": {"name": "math_verify", "params": {"jobs": 1}},
            },
        },
        {
            "name": "exact",
            "weight": 0.5,
            "required": False,
            "backend": {"kind": "managed", "env": "image", "scorer": {"name": "exact_match"}},
        },
        {
            "name": "f1",
            "weight": 0.25,
            "backend": {"kind": "managed", "env": "image", "scorer": {"name": "token_f1"}},
        },
    ]
}
TEXTS = ["so \\boxed{4}", "4", "five", "the answer is 4", "\\boxed{6}", "six", "6 it is", "7"]


def grpo_request() -> RewardRequest:
    """Two groups of four completions, one gold answer per group."""
    items = [
        RewardItem(
            id=f"r{i}",
            group_id=f"q{i // 4}",
            prompt=f"question {i // 4}",
            text=text,
            reference="4" if i < 4 else "6",
        )
        for i, text in enumerate(TEXTS)
    ]
    return RewardRequest(items=items)


def descendants(pid: int) -> list[int]:
    return [child.pid for child in psutil.Process(pid).children(recursive=True)]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """One panel server (with OpenRLHF's route) and the same panel built in this process."""
    tmp = tmp_path_factory.mktemp("panel")
    recipe = tmp / "reward.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    server, ready, log = start_serve(
        tmp, "panel", "--recipe", str(recipe), "--openrlhf-secret-file", str(tmp / "secret")
    )
    local = build_panel(load_recipe(recipe).train)  # its children boot while the server's do
    try:
        info = wait_ready(ready, 90)
        assert info.get("ready") is True, (info, log.read_text()[-3000:])
        # a math child's grading workers start after it says ready: one call each brings them up, so
        # that they are this fixture's processes, not new ones of the first test
        local.compute_rewards(grpo_request())
        with RemoteRewardBackend(f"http://127.0.0.1:{info['port']}", token=TOKEN) as remote:
            remote.compute_rewards(grpo_request())
        yield {
            "server": server,
            "info": info,
            "local": local,
            "tmp": tmp,
            "log": log,
            "recipe": recipe,
        }
    finally:
        local.close()
        if server.poll() is None:
            stop_serve(server)


@pytest.mark.slow
def test_a_served_panel_scores_a_grpo_batch_as_the_same_panel_in_process(served):
    info, local = served["info"], served["local"]
    url = f"http://127.0.0.1:{info['port']}"
    request = grpo_request()
    expected = local.compute_rewards(request)
    # two chunks, whole groups
    with RemoteRewardBackend(url, token=TOKEN, request_batch_size=4) as remote:
        got = remote.compute_rewards(request)
        health = remote.health()
    assert got.ids == expected.ids and got.rewards == expected.rewards
    parts = zip(*(expected.component_rewards[t] for t in ("correct", "exact", "f1")), strict=True)
    # weighted
    assert expected.rewards == pytest.approx([c + 0.5 * e + 0.25 * f for c, e, f in parts])
    assert len(set(expected.rewards)) > 2  # a batch that tells the terms apart
    for term in ("correct", "exact", "f1"):
        assert got.component_rewards[term] == expected.component_rewards[term], term
    assert got.component_rewards["weighted_reward"] == expected.rewards
    # /health: the panel's identity (the in-process panel's), each term's scorer identity, the
    # reward term
    assert (
        health["reward_term"] == "weighted_reward" and got.identity_hash == health["identity_hash"]
    )
    assert health["identity"]["panel"] == local.identity_hash
    assert [t["scorer"] for t in health["identity"]["terms"]] == [
        t.backend.identity_hash for t in local.terms
    ]
    assert all(len(t["scorer"]) == 64 for t in health["identity"]["terms"])
    metrics = httpx.get(
        f"{url}/metrics", headers={"authorization": f"Bearer {TOKEN}"}, timeout=10
    ).text
    # 8 items of the fixture's first call, 8 of this test's
    assert 'managed_scorers_child_items_total{scorer="panel",rank="0"} 16' in metrics, metrics
    assert httpx.get(f"{url}/health", timeout=10).status_code == 401  # the same token guards it


@pytest.mark.slow
def test_required_rewards_asks_the_server_for_those_terms_and_their_weighted_sum(served):
    info, local = served["info"], served["local"]
    url = f"http://127.0.0.1:{info['port']}"
    request = grpo_request()
    subset = RewardPanel(
        [t for t in local.terms if t.name in ("correct", "f1")], owns_backends=False
    )
    with RemoteRewardBackend(url, token=TOKEN, required_rewards=["correct", "f1"]) as remote:
        got = remote.compute_rewards(request)
    # exact was never scored
    assert set(got.component_rewards) == {"correct", "f1", "weighted_reward"}
    assert got.rewards == subset.compute_rewards(request).rewards
    with pytest.raises(ConfigError, match="weighs its own terms"):
        RemoteRewardBackend(url, token=TOKEN, weights={"correct": 2.0})
    with pytest.raises(ConfigError, match="not terms of scorer"):
        RemoteRewardBackend(url, token=TOKEN, required_rewards=["nope"])


@pytest.mark.slow
def test_a_recipe_term_on_a_remote_panel_server_and_the_openrlhf_route(served, monkeypatch):
    info, local, tmp = served["info"], served["local"], served["tmp"]
    url = f"http://127.0.0.1:{info['port']}"
    request = grpo_request()
    monkeypatch.setenv("PANEL_TOKEN", TOKEN)
    outer = {
        "terms": [
            {
                "name": "served",
                "weight": 2.0,
                "backend": {"kind": "remote", "base_url": url, "token_env": "PANEL_TOKEN"},
            }
        ]
    }
    with build_panel(load_recipe(outer).train) as panel:
        got = panel.compute_rewards(request)
    assert got.rewards == [2.0 * r for r in local.compute_rewards(request).rewards]
    secret = (tmp / "secret").read_text().strip()
    body = {"query": ["P so \\boxed{4}", "P five"], "prompts": ["P", "P"], "labels": ["4", "4"]}
    answer = httpx.post(f"{url}/openrlhf/{secret}", content=json.dumps(body), timeout=60).json()
    plain = RewardRequest(
        items=[
            RewardItem(id=str(i), prompt="P", text=t, reference="4")
            for i, t in enumerate(["so \\boxed{4}", "five"])
        ]
    )
    expected = local.compute_rewards(plain)
    assert answer["rewards"] == expected.rewards and answer["scores"] == expected.rewards
    assert answer["extra_logs"] == {
        term: expected.component_rewards[term] for term in ("correct", "exact", "f1")
    }


@pytest.mark.slow
def test_sigterm_stops_the_panel_server_and_every_child_it_started(served):
    server = served["server"]
    children = descendants(server.pid)
    assert (
        len([c for c in children if "child_runtime" in " ".join(psutil.Process(c).cmdline())]) == 3
    )
    assert stop_serve(server) == 0
    assert wait_until_gone(children, 10) == []
    assert "Traceback" not in served["log"].read_text()


@pytest.mark.slow
def test_a_sigkilled_panel_server_takes_its_children_with_it(tmp_path):
    recipe = tmp_path / "reward.yaml"
    recipe.write_text(yaml.safe_dump({"terms": [RECIPE["terms"][1]]}))
    server, ready, log = start_serve(tmp_path, "one", "--recipe", str(recipe))
    try:
        assert wait_ready(ready, 60).get("ready") is True, log.read_text()[-3000:]
        children = descendants(server.pid)
        assert children
        os.kill(server.pid, signal.SIGKILL)
        server.wait(10)
        assert wait_until_gone(children, 10) == []  # their lifeline saw the server go
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_serve_refuses_a_bad_recipe_and_scorer_options_beside_one(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("terms: []\n")
    started = time.monotonic()
    server, _, log = start_serve(tmp_path, "bad", "--recipe", str(bad))
    assert server.wait(30) == 2 and "terms" in log.read_text()
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump({"terms": [RECIPE["terms"][1]]}))
    mixed, _, log = start_serve(tmp_path, "mixed", "--recipe", str(good), "--env", "image")
    assert mixed.wait(30) == 2 and "belong to --scorer" in log.read_text()
    assert time.monotonic() - started < 30


def test_the_panel_scorer_scores_only_the_terms_asked_for_and_keeps_optional_failures_per_term(
    tmp_path,
):
    """In-process (local terms, no children): what the server runs for each request."""
    from scorers.base import ScoreInputError, ScoreItem, score_checked
    from supervisor.ops.panel_scorer import PanelScorer

    journal = tmp_path / "journal"
    local = {
        "kind": "local",
        "scorer": {
            "name": "tests.helpers.fixture_scorers:Journal",
            "params": {"path": str(journal)},
        },
    }
    flaky = {"kind": "local", "scorer": {"name": "tests.helpers.fixture_scorers:Raises"}}
    recipe = tmp_path / "reward.yaml"
    terms = [
        {"name": "logged", "weight": 3.0, "backend": local},
        {"name": "maths", "backend": flaky, "required": False, "applicable_datasets": ["math"]},
    ]
    recipe.write_text(yaml.safe_dump({"terms": terms}))
    scorer = PanelScorer(str(recipe))
    scorer.load()
    try:
        items = [
            ScoreItem(id="a", text="x", data_source="chat"),
            ScoreItem(id="b", text="y", data_source="math"),
        ]
        whole = score_checked(scorer, items)
        assert whole.terms["weighted_reward"] == [3.0, 3.0] and whole.terms["logged"] == [1.0, 1.0]
        # "a": not applicable
        assert list(whole.term_failed) == ["maths"] and list(whole.term_failed["maths"]) == [1]
        # marked, never a 0.0 that a client would read
        assert whole.not_applicable == {"maths": {0}}
        assert math.isnan(whole.terms["maths"][0])
        journal.unlink()
        narrowed = score_checked(scorer, items[1:], terms=["maths", "weighted_reward"])
        assert not journal.exists()  # the term not asked for was never scored
        assert list(narrowed.terms) == ["maths", "weighted_reward"] and narrowed.terms[
            "weighted_reward"
        ] == [0.0]
        assert list(narrowed.term_failed["maths"]) == [0]
        # a 422, as in-process
        with pytest.raises(ScoreInputError, match="no term of the panel applies to item 'a'"):
            score_checked(scorer, items, terms=["maths"])
        assert scorer.spec.identity["panel"] == scorer.panel.identity_hash
    finally:
        scorer.close()


@pytest.mark.slow
def test_ctrl_c_stops_a_panel_server_gracefully_too(tmp_path):
    recipe = tmp_path / "reward.yaml"
    recipe.write_text(yaml.safe_dump({"terms": [RECIPE["terms"][1]]}))
    server, ready, log = start_serve(tmp_path, "one", "--recipe", str(recipe))
    try:
        assert wait_ready(ready, 60).get("ready") is True, log.read_text()[-3000:]
        children = descendants(server.pid)
        server.send_signal(signal.SIGINT)
        assert server.wait(15) == 0, log.read_text()[-3000:]
        assert wait_until_gone(children, 10) == []
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_a_served_panel_takes_the_requests_group_size_and_marks_terms_that_do_not_apply(tmp_path):
    """Local terms only (no children): a groupwise term needs the group size the request declares
    (the recipe gives none), and a term limited to `math` items reaches the client as None elsewhere
    (its `applicable` False), the item's reward whole; the weighted reward is the in-process
    panel's."""
    spy = {"kind": "local", "scorer": {"name": "tests.helpers.fixture_scorers:GroupSpy"}}
    length = {"kind": "local", "scorer": {"name": "tests.helpers.fixture_scorers:Probe"}}
    terms = [
        {"name": "sized", "weight": 1.0, "backend": spy, "component": "group_size"},
        {"name": "long", "weight": 0.5, "backend": length, "applicable_datasets": ["math"]},
    ]
    recipe = tmp_path / "reward.yaml"
    recipe.write_text(yaml.safe_dump({"terms": terms}))
    sources = ["math", "math", "chat", "chat"]  # a group shares its data source
    items = [
        RewardItem(
            id=f"r{i}", group_id=f"q{i // 2}", prompt="p", text="x" * (i + 1), data_source=source
        )
        for i, source in enumerate(sources)
    ]
    server, ready, log = start_serve(tmp_path, "local", "--recipe", str(recipe))
    try:
        info = wait_ready(ready, 60)
        assert info.get("ready") is True, log.read_text()[-3000:]
        with (
            RemoteRewardBackend(f"http://127.0.0.1:{info['port']}", token=TOKEN) as remote,
            build_panel(load_recipe(recipe).train) as local,
        ):
            request = RewardRequest(items=items, group_size=2)
            got, expected = remote.compute_rewards(request), local.compute_rewards(request)
            # 2 + 0.5 x length where it applies
            assert got.rewards == expected.rewards == [2.5, 3.0, 2.0, 2.0]
            assert (
                got.component_rewards["long"]
                == expected.component_rewards["long"]
                == [1.0, 2.0, None, None]
            )
            assert got.applicable["long"] == [True, True, False, False] and all(got.usable())
            assert got.successes == [True] * 4
            # the panel's own check
            with pytest.raises(ScorerRequestError, match="declare group_size"):
                remote.compute_rewards(RewardRequest(items=items))
    finally:
        assert stop_serve(server) == 0


def _term_children(server: int) -> list[int]:
    return [
        pid
        for pid in descendants(server)
        if "child_runtime" in " ".join(psutil.Process(pid).cmdline())
    ]


@pytest.mark.slow
def test_a_served_panel_says_ready_once_its_math_terms_grading_workers_are_up(tmp_path):
    """serve --recipe says ready only when every term is warm (item 11: PanelScorer did not forward
    warming(), so the server said ready while its math child's grading workers still started): at
    the readiness line, the math child's process group already holds what it holds once it has
    scored."""
    recipe = tmp_path / "reward.yaml"
    recipe.write_text(yaml.safe_dump({"terms": [RECIPE["terms"][0]]}))
    server, ready, log = start_serve(tmp_path, "math", "--recipe", str(recipe))
    try:
        info = wait_ready(ready, 90)
        assert info.get("ready") is True and info["warming"] is False, log.read_text()[-3000:]
        (child,) = _term_children(server.pid)
        at_ready = group_members(child)
        with RemoteRewardBackend(f"http://127.0.0.1:{info['port']}", token=TOKEN) as remote:
            assert remote.compute_rewards(grpo_request()).rewards[:2] == [1.0, 1.0]
        # its workers were all up at ready
        assert len(at_ready) == len(group_members(child)), at_ready
    finally:
        assert stop_serve(server) == 0


@pytest.mark.slow
def test_a_required_terms_crash_is_a_server_fault_that_a_client_of_several_servers_fails_over_on(
    tmp_path,
):
    """A served panel whose required term's child is gone answers 503 `server_fault` (item 11: 500
    `scorer_error`, the scorer's own verdict, which no client re-sends elsewhere), so that a client
    of several panel servers re-sends that share to another server and the call succeeds."""
    from supervisor import MultiRemoteRewardBackend

    process = {"python_executable": sys.executable, "extra_import_paths": [str(REPO_ROOT)]}
    probe = {
        "kind": "managed",
        "process": process,
        "scorer": {"name": "tests.helpers.fixture_scorers:Probe"},
    }
    # a child that dies stays dead: every call finds the term down
    probe["restart"] = {"max_restarts": 0}
    recipe = tmp_path / "reward.yaml"
    recipe.write_text(yaml.safe_dump({"terms": [{"name": "probe", "backend": probe}]}))
    servers = [start_serve(tmp_path, name, "--recipe", str(recipe)) for name in ("a", "b")]
    try:
        urls = []
        for _server, ready, log in servers:
            info = wait_ready(ready, 60)
            assert info.get("ready") is True, log.read_text()[-3000:]
            urls.append(f"http://127.0.0.1:{info['port']}")
        (term,) = _term_children(servers[0][0].pid)
        os.kill(term, signal.SIGKILL)
        assert wait_until_gone([term], 10) == []
        request = RewardRequest(
            items=[RewardItem(id=f"i{i}", text="x" * (i + 1)) for i in range(4)]
        )
        with RemoteRewardBackend(urls[0], token=TOKEN, max_retries=2) as alone:
            for _ in range(2):  # the child found dead, then the crash loop the policy declares
                with pytest.raises(ScorerRequestError) as e:
                    alone.compute_rewards(request)
                assert (e.value.status, e.value.kind) == (503, "server_fault"), e.value
                assert "panel term(s) probe" in str(e.value) and "Scorer" in str(e.value)
        # never sent to the same server again (each try would restart the term's child: a crash
        # loop), only elsewhere
        metrics = httpx.get(
            f"{urls[0]}/metrics", headers={"authorization": f"Bearer {TOKEN}"}, timeout=10
        ).text
        faults = [
            line
            for line in metrics.splitlines()
            if line.startswith("managed_scorers_child_errors_total") and "server_fault" in line
        ]
        assert len(faults) == 1 and faults[0].endswith(" 2"), faults
        with MultiRemoteRewardBackend(urls, token=TOKEN, max_retries=0) as both:
            assert both.compute_rewards(request).rewards == [1.0, 2.0, 3.0, 4.0]
    finally:
        for server, _, _ in servers:
            assert stop_serve(server) == 0
