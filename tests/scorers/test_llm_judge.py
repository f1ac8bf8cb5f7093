"""llm_judge against a fake OpenAI-compatible server on loopback (bench/fake_openai.py): the failure
matrix, retries that resend the same bytes, the credential kept out of identity, logs and errors,
refusals naming the item, the term under a panel, and the same verdicts in a managed child."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from bench.fake_openai import FakeOpenAI, default_score
from bench.judge_matrix import CASES, PARAMS, Case, closed_port, run
from supervisor import (
    LocalRewardBackend,
    PanelTerm,
    RewardItem,
    RewardPanel,
    RewardRequest,
    ScorerItemsFailed,
    ScorerRequestError,
    ScorerStartupError,
)
from tests.conftest import env_python

SECRET = "sk-test-0123456789abcdef"


@pytest.fixture
def server():
    with FakeOpenAI() as fake:
        yield fake


def judge_params(server: FakeOpenAI, **extra) -> dict:
    return {**PARAMS, "base_url": server.base_url, **extra}


def items(*texts: str, prompt: str | None = "What is 6 x 7?", reference=None) -> list[RewardItem]:
    return [
        RewardItem(id=f"i{n}", prompt=prompt, text=t, reference=reference)
        for n, t in enumerate(texts)
    ]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_failure_matrix(case: Case):
    outcome = run(case)
    assert outcome.seconds < case.within_s, outcome
    if case.error:
        assert outcome.rewards is None and outcome.error is not None
        assert (
            case.error in outcome.error and "could not score 1 of 1 items: 'i0': " in outcome.error
        ), outcome.error
        assert "0 attempts" not in outcome.error
        assert "/v1/chat/completions" in outcome.error and "fake-judge" in outcome.error
    elif case.reward is not None:
        assert outcome.rewards == [case.reward], outcome
    else:  # the concurrency row: every item judged, never more than `concurrency` requests at once
        assert outcome.rewards == [(n % 11) / 10 for n in range(16)]
        assert outcome.max_in_flight == case.params["concurrency"]
    assert outcome.attempts == [case.attempts] * len(case.texts), outcome
    if case.name == "429 twice":  # Retry-After (0.3 s) outweighs the backoff (0.1 s, then 0.2 s)
        assert min(outcome.gaps[0]) >= 0.3, outcome.gaps
    assert all(
        d == (1 if a else 0) for d, a in zip(outcome.distinct, outcome.attempts, strict=True)
    ), outcome


def test_the_key_is_sent_but_stays_out_of_identity_and_errors(server, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", SECRET)
    params = judge_params(server, api_key_env="JUDGE_KEY")
    with LocalRewardBackend("llm_judge", params=params) as judge:
        assert judge.compute_rewards(RewardRequest(items=items("[[score:9]]"))).rewards == [0.9]
        assert server.requests[-1].authorization == f"Bearer {SECRET}"
        with pytest.raises(ScorerRequestError) as info:
            judge.compute_rewards(RewardRequest(items=items("[[echo_auth]]")))
        assert "HTTP 401" in str(info.value) and "Bearer ***" in str(info.value)
        assert SECRET not in str(info.value) and SECRET not in repr(info.value.__cause__)
        shown = repr(judge.shape) + str(judge.identity_hash)
    assert SECRET not in shown
    # the reference is identity; the secret never is
    monkeypatch.setenv("JUDGE_KEY", "another-secret")
    with LocalRewardBackend("llm_judge", params=params) as again:
        assert again.identity_hash == LocalRewardBackend("llm_judge", params=params).identity_hash


def test_an_unset_key_variable_refuses_to_start(server, monkeypatch):
    monkeypatch.delenv("JUDGE_KEY", raising=False)
    with pytest.raises(
        RuntimeError, match="environment variable JUDGE_KEY \\(api_key_env\\) is not set"
    ):
        with LocalRewardBackend(
            "llm_judge", params=judge_params(server, api_key_env="JUDGE_KEY")
        ) as judge:
            judge.compute_rewards(RewardRequest(items=items("[[score:1]]")))


def test_choice_parser(server):
    params = judge_params(server, parser="choice", choices={"A": 1.0, "B": 0.0, "tie": 0.5})
    with LocalRewardBackend("llm_judge", params=params) as judge:
        got = judge.compute_rewards(
            RewardRequest(items=items("[[choice:A]]", "[[choice:tie]]", "[[choice:B]]"))
        )
        assert got.rewards == [1.0, 0.5, 0.0]
        assert got.diagnostics["llm_judge"]["values"]["attempts"] == 3
        with pytest.raises(
            ScorerItemsFailed, match="'i1': unparsable verdict \\(expected one of"
        ) as info:
            judge.compute_rewards(RewardRequest(items=items("[[choice:A]]", "[[choice:C]]")))
        assert (
            info.value.partial.rewards == [1.0]
            and info.value.partial.diagnostics["llm_judge"]["values"]["unparsable"] == 1
        )


def test_the_template_fills_prompt_completion_and_reference(server):
    template = "Q: {prompt}\nGold: {reference}\nA: {completion}\nScore: 0-10"
    params = judge_params(
        server, prompt_template=template, system_prompt="You grade.", score_range=[0, 20]
    )
    with LocalRewardBackend("llm_judge", params=params) as judge:
        got = judge.compute_rewards(
            RewardRequest(items=items("[[score:5]] 42", reference={"answer": 42}))
        )
    assert got.rewards == [0.25]
    body = server.requests[-1].body.decode()
    assert '"role": "system", "content": "You grade."' in body
    assert 'Q: What is 6 x 7?\\nGold: {\\"answer\\": 42}\\nA: [[score:5]] 42' in body


def test_a_default_score_is_parsed_from_a_free_reply(server):
    with LocalRewardBackend("llm_judge", params=judge_params(server)) as judge:
        got = judge.compute_rewards(RewardRequest(items=items("a plain answer")))
    sent = json.loads(server.requests[-1].body)["messages"][-1]["content"]
    assert got.rewards == [pytest.approx(default_score(sent) / 10)]


# -- refusals ----------------------------------------------------------------------------------
def test_missing_inputs_are_refused_naming_the_item_before_any_call(server):
    with_reference = judge_params(server, prompt_template="{completion} vs {reference}")
    with LocalRewardBackend("llm_judge", params=with_reference) as judge:
        with pytest.raises(ScorerRequestError, match="item 'i1': a reference is required") as info:
            judge.compute_rewards(
                RewardRequest(
                    items=[
                        RewardItem(id="i0", text="x", reference="y"),
                        RewardItem(id="i1", text="x"),
                    ]
                )
            )
        assert info.value.kind == "bad_input"
    with LocalRewardBackend("llm_judge", params=judge_params(server)) as judge:
        with pytest.raises(ScorerRequestError, match="item 'i0': field 'prompt' is required"):
            judge.compute_rewards(RewardRequest(items=items("x", prompt=None)))
    assert server.requests == []


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"answer_pattern": "(unclosed"}, "answer_pattern '\\(unclosed' does not compile"),
        ({"answer_pattern": "no group"}, "exactly one group"),
        ({"prompt_template": "{completion} {secret}"}, "placeholder {secret} is not one of"),
        ({"prompt_template": "{prompt} only"}, "must contain {completion}"),
        ({"base_url": "http://user:pw@judge:8000/v1"}, "must not carry credentials"),
        ({"base_url": "judge:8000"}, "base_url must be an http"),
        ({"parser": "choice"}, "needs choices like"),
        ({"score_range": [10, 0]}, "low < high"),
        ({"api_key_env": "sk-abc"}, "must name an environment variable"),
        ({"concurrency": 0}, "concurrency must be a positive int"),
        ({"api_key": SECRET}, "unexpected keyword argument 'api_key'"),
    ],
)
def test_bad_params_are_refused_at_construction(server, extra, message):
    with pytest.raises((ValueError, TypeError), match=message) as info:
        LocalRewardBackend("llm_judge", params=judge_params(server, **extra))
    assert SECRET not in str(info.value)


# -- under a panel: optional or required like any other term ------------------------------------
def test_items_the_judge_fails_get_nothing_from_an_optional_term_and_fail_a_required_one(server):
    texts = ["[[score:5]] #### 1", "[[status:500]] #### 1", "[[score:10]] #### 2"]
    request = RewardRequest(
        items=[
            RewardItem(id=f"i{n}", prompt="1?", text=text, reference="1")
            for n, text in enumerate(texts)
        ]
    )
    for required in (False, True):
        terms = [
            PanelTerm("gsm8k", LocalRewardBackend("gsm8k")),
            PanelTerm(
                "judge",
                LocalRewardBackend("llm_judge", params=judge_params(server)),
                required=required,
            ),
        ]
        with RewardPanel(terms) as panel:
            if required:
                with pytest.raises(
                    ScorerItemsFailed, match="could not score 1 of 3 items: 'i1': 3 attempts failed"
                ):
                    panel.compute_rewards(request)
                continue
            got = panel.compute_rewards(request)
        assert got.component_rewards["judge"] == [0.5, None, 1.0]
        assert got.rewards == [1.5, 1.0, 1.0]
        (failure,) = got.term_failures
        assert failure.term == "judge" and failure.ids == ["i1"] and "HTTP 500" in failure.error
        assert got.diagnostics["judge"]["values"]["failed"] == 1
        # the tail: each item's judging time, the one retried three times the slowest
        tail = got.diagnostics["judge"]["values"]
        assert sum(tail["call_s"]["counts"]) == 3 and tail["slowest"]["top"][0][0] == "i1"


# -- a managed child (envs/image) --------------------------------------------------------------
@pytest.mark.slow
def test_managed_judge_matches_in_process_keeps_the_secret_out_of_its_log_and_names_failed_items(
    managed, server, monkeypatch, tmp_path
):
    monkeypatch.setenv("JUDGE_KEY", SECRET)
    params = judge_params(server, api_key_env="JUDGE_KEY")
    request = RewardRequest(
        items=items("[[score:3]]", "[[slow:1.5x1]][[score:8]]", "[[status:503x1]][[score:10]]")
    )
    with LocalRewardBackend("llm_judge", params=params) as local:
        expected = local.compute_rewards(request)
    backend = managed(
        env_python("image"), "llm_judge", params=params, process={"log_dir": str(tmp_path)}
    )
    got = backend.compute_rewards(request)
    assert got.rewards == expected.rewards == [0.3, 0.8, 1.0]
    assert got.identity_hash == expected.identity_hash
    assert backend.health()["packages"]["httpx"] == "0.28.1"
    with pytest.raises(ScorerRequestError) as info:
        backend.compute_rewards(
            RewardRequest(items=items("[[score:2]]", "[[score:11]]", "[[echo_auth]]"))
        )
    message = str(info.value)
    assert isinstance(info.value, ScorerItemsFailed) and "could not score 2 of 3 items" in message
    assert "'i1': score 11 outside score_range" in message and "'i2': HTTP 401" in message
    assert (
        info.value.partial.rewards == [0.2]
        and info.value.partial.diagnostics["llm_judge"]["values"]["out_of_range"] == 1
    )
    assert SECRET not in message
    # still serving
    assert backend.compute_rewards(RewardRequest(items=items("[[score:4]]"))).rewards == [0.4]
    logs = Path(backend.log_path).read_text(errors="replace")
    # the child's whole log (its boot config carries the variable's name only)
    assert SECRET not in logs


@pytest.mark.slow
def test_managed_unreachable_judge_and_unset_key(managed, monkeypatch):
    params = {**PARAMS, "base_url": f"http://127.0.0.1:{closed_port()}/v1"}
    backend = managed(env_python("image"), "llm_judge", params=params)
    with pytest.raises(ScorerItemsFailed, match="'i0': 3 attempts failed; last: ConnectError"):
        backend.compute_rewards(RewardRequest(items=items("[[score:1]]")))
    monkeypatch.delenv("JUDGE_KEY", raising=False)
    with pytest.raises(ScorerStartupError, match="JUDGE_KEY \\(api_key_env\\) is not set"):
        managed(env_python("image"), "llm_judge", params={**params, "api_key_env": "JUDGE_KEY"})


def test_many_items_behind_a_stuck_server_end_at_the_batch_deadline(server):
    """Three items, one connection, a server that trickles headers forever: each attempt ends at its
    own deadline however the bytes trickle, the batch returns at its deadline, the items that never
    got a turn are not sent late, and the stuck attempt's thread does not hold up the next batch."""
    params = judge_params(server, concurrency=1, batch_timeout_s=2.0)
    with LocalRewardBackend("llm_judge", params=params) as judge:
        began = time.monotonic()
        with pytest.raises(ScorerItemsFailed) as info:
            judge.compute_rewards(
                RewardRequest(items=items(*[f"[[trickle_headers:0.3]] {n}" for n in range(3)]))
            )
        assert time.monotonic() - began < 2.0 + 0.6
        assert set(info.value.failed) == {"i0", "i1", "i2"} and server.requests
        # only the first item was sent
        assert len(server.bodies_with("]] 0")) == len(server.requests)
        assert judge.compute_rewards(RewardRequest(items=items("[[score:6]]"))).rewards == [0.6]


def test_a_key_with_a_trailing_newline_is_refused_without_echoing_it(server, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", SECRET + "\n")
    with pytest.raises(RuntimeError, match="whitespace, control or non-ASCII") as info:
        with LocalRewardBackend(
            "llm_judge", params=judge_params(server, api_key_env="JUDGE_KEY")
        ) as judge:
            judge.compute_rewards(RewardRequest(items=items("[[score:1]]")))
    assert SECRET not in str(info.value)


def test_default_parsers_read_what_judges_write(server):
    choice = judge_params(server, parser="choice", choices={"A": 1.0, "B": 0.0})
    with LocalRewardBackend("llm_judge", params=choice) as judge:
        got = judge.compute_rewards(RewardRequest(items=items("[[choice:b]]", "[[choice:A]]")))
    assert got.rewards == [0.0, 1.0]  # labels match whatever the case
    # _Final: an item's verdict that no retry can change
    from scorers.builtin.llm_judge import LlmJudge, _Final

    number = LlmJudge(base_url=server.base_url, model="m")
    assert number._verdict("Reasoning...\nScore: 7/10") == 0.7
    with pytest.raises(_Final, match="unparsable score"):
        number._verdict("Score: 1e1")
    lettered = LlmJudge(
        base_url=server.base_url, model="m", parser="choice", choices={"A": 1.0, "B": 0.0}
    )
    assert lettered._verdict("The answer is A.") == 1.0 and lettered._verdict("Verdict: [B]") == 0.0


def test_a_completion_with_a_lone_surrogate_is_sent_escaped(server):
    with LocalRewardBackend("llm_judge", params=judge_params(server)) as judge:
        got = judge.compute_rewards(RewardRequest(items=items("[[score:2]] x\ud800y")))
    assert got.rewards == [0.2]
