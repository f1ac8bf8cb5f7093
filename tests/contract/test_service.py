"""RewardService fail-fast semantics, request/response types, local chunking and weights, answer
checks."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable

import numpy as np
import pytest
from pydantic import ValidationError

from supervisor import (
    LocalRewardBackend,
    PrecomputedRewardError,
    RewardBackend,
    RewardContractError,
    RewardItem,
    RewardRequest,
    RewardResponse,
    RewardService,
)
from supervisor.errors import ChildRecord, ConfigError, ScorerRequestError
from supervisor.verify import verify_score_answer
from tests.helpers.fixture_scorers import journal_calls

PROBE = "tests.helpers.fixture_scorers:Probe"


def items_with_texts(*texts: str) -> list[RewardItem]:
    return [
        RewardItem(id=f"s{n}", text=t, prompt=f"p{n}", group_id=f"g{n}")
        for n, t in enumerate(texts)
    ]


class FakeBackend(RewardBackend):
    """A test double of the RewardBackend interface: answers whatever `answer` builds."""

    def __init__(self, answer: Callable[[RewardRequest], RewardResponse]) -> None:
        self.answer = answer
        self.requests: list[RewardRequest] = []
        self.closed = 0

    def compute_rewards(self, request: RewardRequest) -> RewardResponse:
        self.requests.append(request)
        return self.answer(request)

    def close(self) -> None:
        self.closed += 1


def response(ids, rewards, successes=None, errors=None, components=None) -> RewardResponse:
    n = len(ids)
    return RewardResponse(
        ids=list(ids),
        rewards=list(rewards),
        component_rewards=components if components is not None else {"t": list(rewards)},
        successes=successes if successes is not None else [True] * n,
        errors=errors if errors is not None else [None] * n,
    )


# -- RewardService with a real local backend --------------------------------------------------
def test_score_and_attach_returns_new_items_with_rewards_in_order():
    items = items_with_texts("a", "bbb", "", "cc")
    snapshot = [item.model_dump() for item in items]
    with LocalRewardBackend(PROBE) as backend:
        scored = RewardService(backend).score_and_attach(items)
    assert [s.id for s in scored] == ["s0", "s1", "s2", "s3"]
    assert [s.reward for s in scored] == [1.0, 3.0, 0.0, 2.0]
    assert [s.component_rewards for s in scored] == [
        {"probe": 1.0},
        {"probe": 3.0},
        {"probe": 0.0},
        {"probe": 2.0},
    ]
    for before, original, new in zip(snapshot, items, scored, strict=True):
        assert new is not original
        assert original.reward is None and original.component_rewards is None
        assert original.model_dump() == before
        # everything but the reward fields is carried over
        assert {
            k: v for k, v in new.model_dump().items() if k not in ("reward", "component_rewards")
        } == {k: v for k, v in before.items() if k not in ("reward", "component_rewards")}


def test_score_and_attach_with_a_rule_scorer_and_images_untouched():
    image = np.full((8, 8, 3), 9, dtype=np.uint8)
    items = [
        RewardItem(id="x", text="42", reference={"answer": "42"}, image=image),
        RewardItem(id="y", text="41", reference="42"),
    ]
    with LocalRewardBackend("exact_match") as backend:
        scored = RewardService(backend).score_and_attach(items)
    assert [(s.id, s.reward, s.component_rewards) for s in scored] == [
        ("x", 1.0, {"exact_match": 1.0}),
        ("y", 0.0, {"exact_match": 0.0}),
    ]
    assert scored[0].image is image and image.flags.writeable and int(image.sum()) == 9 * 8 * 8 * 3


@pytest.mark.parametrize(
    "update,field",
    [
        ({"reward": 0.0}, "reward"),
        ({"component_rewards": {"t": 1.0}}, "component_rewards"),
        ({"reward": 1.0, "component_rewards": {}}, "both"),
    ],
)
def test_precomputed_rewards_are_refused_before_the_backend_is_called(update, field):
    backend = FakeBackend(lambda r: pytest.fail("backend must not be called"))
    items = items_with_texts("a", "b", "c")
    items[2] = items[2].model_copy(update=update)
    with pytest.raises(
        PrecomputedRewardError, match=re.escape("items[2] (id='s2') already carries a reward")
    ):
        RewardService(backend).score_and_attach(items)
    assert backend.requests == []


def test_scored_items_cannot_be_scored_twice():
    with LocalRewardBackend(PROBE) as backend:
        service = RewardService(backend)
        scored = service.score_and_attach(items_with_texts("a"))
        with pytest.raises(PrecomputedRewardError, match="id='s0'"):
            service.score_and_attach(scored)


def test_nan_from_the_scorer_names_the_item_and_returns_nothing():
    items = items_with_texts("a", "b", "c")
    result = None
    with LocalRewardBackend("tests.helpers.fixture_scorers:ReturnsNaN") as backend:
        with pytest.raises(
            RewardContractError, match=re.escape("non-finite score nan for items[0] (id='s0')")
        ):
            result = RewardService(backend).score_and_attach(items)
    assert result is None
    assert all(item.reward is None for item in items)


def test_nan_in_a_later_chunk_names_that_chunks_item():
    items = items_with_texts("a", "b", "c", "d", "e")
    with LocalRewardBackend(
        "tests.helpers.fixture_scorers:ReturnsNaN", request_batch_size=2
    ) as backend:
        # each chunk's first item is NaN; the first chunk fails first
        with pytest.raises(RewardContractError, match=re.escape("(id='s0')")):
            RewardService(backend).score_and_attach(items)


def test_wrong_count_is_a_contract_error():
    with LocalRewardBackend("tests.helpers.fixture_scorers:WrongCount") as backend:
        with pytest.raises(RewardContractError, match="term 'wrong_count': 3 scores for 2 items"):
            RewardService(backend).score_and_attach(items_with_texts("a", "b"))


def test_scorer_exception_is_typed_as_in_a_child_with_the_original_as_cause():
    with LocalRewardBackend("tests.helpers.fixture_scorers:Raises") as backend:
        with pytest.raises(
            ScorerRequestError, match="ZeroDivisionError: scorer bug on purpose"
        ) as info:
            RewardService(backend).score_and_attach(items_with_texts("a"))
    assert info.value.kind == "scorer_error" and isinstance(info.value.__cause__, ZeroDivisionError)


def test_empty_batch_is_refused():
    backend = FakeBackend(lambda r: pytest.fail("backend must not be called"))
    with pytest.raises(ValidationError, match="items"):
        RewardService(backend).score_and_attach([])


# -- RewardService with a hand-written backend ------------------------------------------------
def test_failed_sample_names_its_id_and_error_text():
    backend = FakeBackend(
        lambda r: response(
            r.ids,
            [0.5, float("nan")],
            successes=[True, False],
            errors=[None, "grader timed out after 10 s"],
            components={"t": [0.5, float("nan")]},
        )
    )
    with pytest.raises(
        RewardContractError,
        match=re.escape("sample 's1' (index 1) failed: grader timed out after 10 s"),
    ):
        RewardService(backend).score_and_attach(items_with_texts("a", "b"))
    assert len(backend.requests) == 1 and backend.requests[0].ids == ["s0", "s1"]


def test_failed_sample_with_a_finite_placeholder_reward_still_fails():
    # zero-filled-on-error must never reach the trainer
    backend = FakeBackend(
        lambda r: response(r.ids, [0.0, 0.0], successes=[False, True], errors=["oom", None])
    )
    with pytest.raises(RewardContractError, match=re.escape("sample 's0' (index 0) failed: oom")):
        RewardService(backend).score_and_attach(items_with_texts("a", "b"))


def test_backend_answering_in_another_order_raises():
    backend = FakeBackend(lambda r: response(list(reversed(r.ids)), [1.0, 2.0, 3.0]))
    with pytest.raises(RewardContractError, match="backend answered for ids"):
        RewardService(backend).score_and_attach(items_with_texts("a", "b", "c"))


def test_backend_answering_for_other_ids_raises():
    backend = FakeBackend(lambda r: response(["s0", "zz"], [1.0, 2.0]))
    with pytest.raises(RewardContractError, match=r"\['s0', 'zz'\].*expected \['s0', 's1'\]"):
        RewardService(backend).score_and_attach(items_with_texts("a", "b"))


def test_backend_answering_for_fewer_ids_raises():
    backend = FakeBackend(lambda r: response(r.ids[:1], [1.0]))
    with pytest.raises(RewardContractError):
        RewardService(backend).score_and_attach(items_with_texts("a", "b"))


def test_non_finite_component_marked_success_raises():
    with pytest.raises(ValueError, match=re.escape("component_rewards['u'][1] (id='s1') is inf")):
        response(["s0", "s1"], [1.0, 2.0], components={"t": [1.0, 2.0], "u": [0.0, math.inf]})
    # a backend that bypasses the model's validation is still caught by the service
    unchecked = RewardResponse.model_construct(
        ids=["s0", "s1"],
        rewards=[1.0, 2.0],
        component_rewards={"t": [1.0, 2.0], "u": [0.0, math.inf]},
        successes=[True, True],
        errors=[None, None],
    )
    backend = FakeBackend(lambda r: unchecked)
    with pytest.raises(
        RewardContractError, match=re.escape("component_rewards['u'][1] (id='s1') is inf")
    ):
        RewardService(backend).score_and_attach(items_with_texts("a", "b"))


def test_fake_backend_success_attaches_its_values():
    backend = FakeBackend(
        lambda r: response(r.ids, [0.25, -1.0], components={"a": [1.0, 2.0], "b": [3.0, 4.0]})
    )
    scored = RewardService(backend).score_and_attach(items_with_texts("a", "b"))
    assert [(s.reward, s.component_rewards) for s in scored] == [
        (0.25, {"a": 1.0, "b": 3.0}),
        (-1.0, {"a": 2.0, "b": 4.0}),
    ]


def test_backend_is_a_context_manager_that_closes():
    backend = FakeBackend(lambda r: response(r.ids, [1.0]))
    with backend as entered:
        assert entered is backend
    assert backend.closed == 1
    assert backend.onload() == {} and backend.offload() == {} and backend.drain() == {}


# -- request / response types ----------------------------------------------------------------
def test_request_rejects_duplicate_ids():
    with pytest.raises(
        ValidationError, match=re.escape("items[2].id 'a' is not unique in the request")
    ):
        RewardRequest(items=[RewardItem(id="a"), RewardItem(id="b"), RewardItem(id="a")])


def test_request_rejects_empty_and_unknown_fields():
    with pytest.raises(ValidationError):
        RewardRequest(items=[])
    with pytest.raises(ValidationError, match="extra"):
        RewardRequest(items=[RewardItem(id="a")], extra=1)
    with pytest.raises(ValidationError, match="id"):
        RewardItem(id="")
    with pytest.raises(ValidationError, match="scroe"):
        RewardItem(id="a", scroe=1.0)


def test_request_ids_in_order():
    assert RewardRequest(items=[RewardItem(id="b"), RewardItem(id="a")]).ids == ["b", "a"]


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"rewards": [1.0]}, "rewards has 1 entries for 2 ids"),
        ({"successes": [True]}, "successes has 1 entries for 2 ids"),
        ({"errors": [None, None, None]}, "errors has 3 entries for 2 ids"),
        (
            {"component_rewards": {"t": [1.0, 2.0], "u": [1.0]}},
            "component_rewards['u'] has 1 entries for 2 ids",
        ),
    ],
    ids=["rewards", "successes", "errors", "component"],
)
def test_response_rejects_misaligned_lengths(overrides, message):
    data = {
        "ids": ["a", "b"],
        "rewards": [1.0, 2.0],
        "component_rewards": {"t": [1.0, 2.0]},
        "successes": [True, True],
        "errors": [None, None],
        **overrides,
    }
    with pytest.raises(ValidationError, match=re.escape(message)):
        RewardResponse(**data)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_response_rejects_non_finite_reward_marked_success(bad):
    with pytest.raises(
        ValidationError, match=re.escape(f"rewards[1] (id='b') is {bad} but marked a success")
    ):
        RewardResponse(
            ids=["a", "b"],
            rewards=[1.0, bad],
            component_rewards={},
            successes=[True, True],
            errors=[None, None],
        )
    ok = RewardResponse(
        ids=["a", "b"],
        rewards=[1.0, bad],
        component_rewards={},
        successes=[True, False],
        errors=[None, "failed"],
    )
    assert ok.successes == [True, False]


# -- LocalRewardBackend: chunking and weights ------------------------------------------------
def test_request_batch_size_chunks_in_order(tmp_path):
    texts = ["x" * n for n in range(10)]
    journal = str(tmp_path / "calls")
    with LocalRewardBackend(PROBE, {"journal": journal}, request_batch_size=4) as backend:
        answer = backend.compute_rewards(RewardRequest(items=items_with_texts(*texts)))
    assert [len(ids) for _, ids in journal_calls(journal)] == [4, 4, 2]
    assert answer.diagnostics == {"probe": {"sample_count": 10, "values": {"calls": 3}}}
    assert answer.rewards == [float(n) for n in range(10)]
    assert answer.component_rewards == {"probe": [float(n) for n in range(10)]}
    assert answer.ids == [f"s{n}" for n in range(10)]


@pytest.mark.parametrize("size,expected", [(1, [1] * 5), (5, [5]), (64, [5]), (2, [2, 2, 1])])
def test_chunk_sizes(size, expected, tmp_path):
    journal = str(tmp_path / "calls")
    with LocalRewardBackend(PROBE, {"journal": journal}, request_batch_size=size) as backend:
        backend.compute_rewards(RewardRequest(items=items_with_texts(*"abcde")))
    assert [len(ids) for _, ids in journal_calls(journal)] == expected


@pytest.mark.parametrize("size", [0, -1])
def test_request_batch_size_must_be_positive(size):
    with pytest.raises(ValueError, match="request_batch_size must be > 0"):
        LocalRewardBackend(PROBE, request_batch_size=size)


def test_weighted_sum_of_one_term():
    texts = ["", "a", "abcd", "abcdefg"]
    with LocalRewardBackend(PROBE, weights={"probe": 2.5}) as backend:
        scored = RewardService(backend).score_and_attach(items_with_texts(*texts))
    assert [s.reward for s in scored] == [0.0, 2.5, 10.0, 17.5]
    assert [s.component_rewards for s in scored] == [{"probe": float(len(t))} for t in texts]


def test_negative_and_zero_weights():
    with LocalRewardBackend(PROBE, weights={"probe": -1.0}) as backend:
        assert backend.compute_rewards(RewardRequest(items=items_with_texts("abc"))).rewards == [
            -3.0
        ]
    with LocalRewardBackend(PROBE, weights={"probe": 0.0}) as backend:
        answer = backend.compute_rewards(RewardRequest(items=items_with_texts("abc")))
    assert answer.rewards == [0.0] and answer.component_rewards == {"probe": [3.0]}


def test_required_rewards_must_be_terms_of_the_scorer():
    with pytest.raises(
        ConfigError, match=r"required_rewards/weights \['bogus'\] are not terms of scorer 'probe'"
    ):
        LocalRewardBackend(PROBE, required_rewards=["bogus"])


def test_closed_local_backend_refuses_calls():
    backend = LocalRewardBackend(PROBE)
    backend.close()
    backend.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        backend.compute_rewards(RewardRequest(items=items_with_texts("a")))


def test_local_backend_runs_in_process(tmp_path):
    journal = str(tmp_path / "calls")
    with LocalRewardBackend(PROBE, {"journal": journal}) as backend:
        backend.compute_rewards(RewardRequest(items=items_with_texts("a")))
    assert journal_calls(journal) == [(os.getpid(), ["s0"])]


# -- verify_score_answer ---------------------------------------------------------------------
IDS = ["a", "b", "c"]


def answer(ids=IDS, **terms):
    return {
        "ids": list(ids),
        "terms": terms or {"t": np.array([1.0, 2.0, 3.0])},
        "diagnostics": {"n": 3},
    }


def test_verify_accepts_a_good_answer():
    values = np.array([1.0, 2.0, 3.0])
    terms, diagnostics, failed, *_ = verify_score_answer(
        answer(t=values, u=np.zeros(3)), IDS, ["t"]
    )
    assert set(terms) == {"t", "u"} and terms["t"] is values
    assert diagnostics == {"n": 3} and failed == {}


def test_verify_rotated_ids_names_position_and_both_ids():
    with pytest.raises(
        RewardContractError, match=re.escape("position 0 echoes id 'b', expected 'a'")
    ):
        verify_score_answer(answer(ids=["b", "c", "a"]), IDS, ["t"])
    with pytest.raises(
        RewardContractError, match=re.escape("position 2 echoes id 'x', expected 'c'")
    ):
        verify_score_answer(answer(ids=["a", "b", "x"]), IDS, ["t"])


def test_verify_wrong_id_count():
    with pytest.raises(RewardContractError, match="answer echoes 2 ids for 3 items"):
        verify_score_answer(answer(ids=["a", "b"]), IDS, ["t"])


@pytest.mark.parametrize("ids", [None, "abc", ("a", "b", "c")])
def test_verify_missing_id_list(ids):
    data = answer()
    data["ids"] = ids
    with pytest.raises(RewardContractError, match="ids must be echoed"):
        verify_score_answer(data, IDS, ["t"])


@pytest.mark.parametrize("data", [None, [], {"ids": IDS}, {"ids": IDS, "terms": [1.0]}])
def test_verify_answer_not_an_object_with_terms(data):
    with pytest.raises(RewardContractError, match="not an object with 'ids' and 'terms'"):
        verify_score_answer(data, IDS, ["t"])


@pytest.mark.parametrize(
    "values,shape",
    [
        (np.array([1.0, 2.0, 3.0], dtype=np.float32), "(3,)"),
        (np.array([1, 2, 3], dtype=np.int64), "(3,)"),
        (np.array([1.0, 2.0]), "(2,)"),
        (np.array([1.0, 2.0, 3.0, 4.0]), "(4,)"),
        (np.array([[1.0, 2.0, 3.0]]), "(1, 3)"),
        ([1.0, 2.0, 3.0], "list"),
    ],
    ids=["float32", "int64", "short", "long", "2d", "list"],
)
def test_verify_term_must_be_float64_of_the_right_length(values, shape):
    with pytest.raises(
        RewardContractError, match=re.escape(f"term 't': expected 3 float64 scores, got {shape}")
    ):
        verify_score_answer(answer(t=values), IDS, ["t"])


@pytest.mark.parametrize("bad,index", [(np.nan, 1), (np.inf, 2), (-np.inf, 0)])
def test_verify_non_finite_names_the_id(bad, index):
    values = np.array([1.0, 2.0, 3.0])
    values[index] = bad
    with pytest.raises(
        RewardContractError,
        match=re.escape(f"term 't': non-finite score {bad} for id {IDS[index]!r}"),
    ):
        verify_score_answer(answer(t=values), IDS, ["t"])


def test_verify_non_finite_in_an_optional_term_also_fails():
    with pytest.raises(RewardContractError, match="term 'extra': non-finite"):
        verify_score_answer(answer(t=np.ones(3), extra=np.array([0.0, np.nan, 0.0])), IDS, ["t"])


def test_verify_missing_required_term():
    with pytest.raises(
        RewardContractError,
        match=re.escape("required rewards ['v'] missing from the answer (got ['t', 'u'])"),
    ):
        verify_score_answer(answer(t=np.ones(3), u=np.ones(3)), IDS, ["t", "v"])


def test_verify_error_carries_the_child_record():
    record = ChildRecord(name="probe", pid=4242, returncode=None, log_tail="last log line")
    with pytest.raises(RewardContractError) as info:
        verify_score_answer(answer(ids=["a", "b"]), IDS, ["t"], record=lambda: record)
    assert info.value.record is record and info.value.pid == 4242
    assert "child 'probe' pid=4242" in str(info.value) and "last log line" in str(info.value)


def test_verify_ignores_non_dict_diagnostics():
    data = answer()
    data["diagnostics"] = [1, 2]
    assert verify_score_answer(data, IDS, ["t"])[1] == {}
