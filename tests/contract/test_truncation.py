"""RewardService's truncation policy: truncated means finish_reason == "length", nothing else."""

from __future__ import annotations

import pytest

from supervisor import (
    ConfigError,
    LocalRewardBackend,
    MissingTokenCountError,
    RewardItem,
    RewardService,
)
from supervisor.service import overlong_penalty

PROBE = "tests.helpers.fixture_scorers:Probe"  # reward = len(text)


def items(*specs: tuple[str | None, int | None]) -> list[RewardItem]:
    return [
        RewardItem(id=f"s{i}", text="abcd", finish_reason=reason, completion_tokens=tokens)
        for i, (reason, tokens) in enumerate(specs)
    ]


@pytest.fixture
def backend():
    with LocalRewardBackend(PROBE) as local:
        yield local


def test_zero_is_the_default_and_zeroes_only_the_length_verdict(backend):
    scored = RewardService(backend).score_and_attach(
        items(("length", 10), ("stop", 10), (None, 10), ("abort", 10))
    )
    assert [s.reward for s in scored] == [0.0, 4.0, 4.0, 4.0]
    # what the scorer said is kept for inspection
    assert scored[0].component_rewards == {"probe": 4.0}


def test_keep_leaves_the_reward(backend):
    scored = RewardService(backend, truncation="keep").score_and_attach(
        items(("length", 10), ("stop", 10))
    )
    assert [s.reward for s in scored] == [4.0, 4.0]


def test_soft_is_dapos_linear_overlong_penalty(backend):
    service = RewardService(
        backend,
        truncation="soft",
        max_response_length=100,
        overlong_buffer_len=20,
        overlong_penalty_factor=2.0,
    )
    scored = service.score_and_attach(
        items(("stop", 50), ("stop", 80), ("stop", 90), ("length", 100), (None, 95))
    )
    assert [s.reward for s in scored] == pytest.approx([4.0, 4.0, 3.0, 2.0, 2.5])


def test_soft_refuses_an_item_without_a_token_count(backend):
    service = RewardService(
        backend, truncation="soft", max_response_length=100, overlong_buffer_len=20
    )
    with pytest.raises(MissingTokenCountError, match="item 's1' has no completion_tokens"):
        service.score_and_attach(items(("stop", 10), ("stop", None)))
    with pytest.raises(
        MissingTokenCountError, match="item 's0' has 101 tokens, over max_response_length=100"
    ):
        service.score_and_attach(items(("length", 101)))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"truncation": "clip"},
        {"truncation": "soft"},
        {"truncation": "soft", "max_response_length": 100, "overlong_buffer_len": 0},
        {"truncation": "soft", "max_response_length": 100, "overlong_buffer_len": 101},
        {
            "truncation": "soft",
            "max_response_length": 100,
            "overlong_buffer_len": 10,
            "overlong_penalty_factor": -1,
        },
    ],
)
def test_bad_policies_are_refused(backend, kwargs):
    with pytest.raises(ConfigError):
        RewardService(backend, **kwargs)


def test_the_penalty_formula():
    assert overlong_penalty(80, 100, 20, 1.0) == 0.0
    assert overlong_penalty(81, 100, 20, 1.0) == pytest.approx(-0.05)
    assert overlong_penalty(100, 100, 20, 1.0) == -1.0
