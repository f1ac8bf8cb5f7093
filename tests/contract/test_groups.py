"""Groups: checked before any scorer code runs, never split by chunking, one complete group per
groupwise call; and the item fields a scorer gets (finish_reason, tokens, dataset, conditioning)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from pydantic import ValidationError

from child_runtime.protocol import wire
from scorers.base import ScoreInputError, ScoreItem, score_checked
from scorers.groups import GroupInputError, freeze, partition, strict_key
from scorers.pointwise import map_candidates
from supervisor import (
    GroupsIncomplete,
    LocalRewardBackend,
    RewardItem,
    RewardRequest,
    ScorerRequestError,
)
from supervisor.errors import ErrorStatus
from tests.helpers.fixture_scorers import journal_calls

SPY = "tests.helpers.fixture_scorers:GroupSpy"
PROBE = "tests.helpers.fixture_scorers:Probe"


def group(name: str, size: int, **fields) -> list[RewardItem]:
    fields.setdefault("prompt", f"prompt of {name}")
    fields.setdefault("reference", {"answer": "42"})
    return [
        RewardItem(id=f"{name}-{k}", group_id=name, text=f"c{k}", **fields) for k in range(size)
    ]


def both(managed, trainer_python, scorer, **kwargs):
    """The same scorer in-process and in a managed child."""
    client = {key: kwargs[key] for key in ("request_batch_size", "group_size") if key in kwargs}
    local = LocalRewardBackend(scorer, kwargs.get("params"), **client)
    return [local, managed(trainer_python, scorer, params=kwargs.get("params"), client=client)]


# -- refusals, each naming the offending id or group -----------------------------------------------
@pytest.mark.parametrize("where", ["local", "managed"])
def test_an_incomplete_group_is_refused_naming_it(managed, trainer_python, where):
    backend = both(managed, trainer_python, SPY, group_size=3)[where == "managed"]
    with backend if where == "local" else backend:
        with pytest.raises(
            ScorerRequestError, match=r"group 'b' has 2 items, expected group_size 3"
        ) as info:
            backend.compute_rewards(RewardRequest(items=group("a", 3) + group("b", 2)))
    assert info.value.kind == "bad_input"


def test_a_builtin_pointwise_rule_in_a_child_refuses_incomplete_groups(managed, trainer_python):
    """Posttrain's rule: a declared size holds for every provider, the built-in pointwise rules
    included; every incomplete group is named with its count, the call refused whole."""
    backend = managed(trainer_python, "exact_match", client={"group_size": 2})
    with pytest.raises(GroupsIncomplete) as info:
        backend.compute_rewards(RewardRequest(items=group("a", 2) + group("b", 1) + group("c", 3)))
    assert (info.value.group_size, info.value.counts, info.value.kind) == (
        2,
        {"b": 1, "c": 3},
        "bad_input",
    )
    assert "group 'b' has 1 items, expected group_size 2 (ids ['b-0'])" in str(info.value)
    complete = backend.compute_rewards(RewardRequest(items=group("a", 2, reference="c1")))
    assert complete.rewards == [0.0, 1.0]  # exact_match: "c0" and "c1" against "c1"


def test_a_pointwise_provider_never_sees_an_incomplete_group():
    seen: list[str] = []

    def record(candidate, context):
        seen.append(candidate.id)
        return 1.0

    recording = map_candidates(record, name="recording")()
    with LocalRewardBackend(recording, group_size=2) as backend:
        with pytest.raises(GroupsIncomplete, match=r"group 'b' has 1 items"):
            backend.compute_rewards(RewardRequest(items=group("a", 2) + group("b", 1)))
        assert seen == []  # refused before any scorer code ran
        assert backend.compute_rewards(RewardRequest(items=group("a", 2))).rewards == [1.0, 1.0]
    assert seen == ["a-0", "a-1"]


def test_the_child_refuses_an_incomplete_group_itself(managed, trainer_python):
    """A server someone else drives (no parent-side check) refuses too, and keeps serving."""
    backend = managed(trainer_python, SPY)
    frame = wire.prepare({"items": [item.to_wire() for item in group("a", 2)], "group_size": 3})
    with pytest.raises(ErrorStatus, match=r"group 'a' has 2 items, expected group_size 3"):
        backend._gen.client.score(frame)
    assert backend.health()["state"] == "ready"


def test_a_groupwise_scorer_without_a_group_size_is_refused():
    with (
        LocalRewardBackend(SPY) as backend,
        pytest.raises(ScorerRequestError, match="declare group_size"),
    ):
        backend.compute_rewards(RewardRequest(items=group("a", 2)))


def test_an_ungrouped_item_is_refused_when_groups_are_declared():
    items = [*group("a", 2), RewardItem(id="loner", text="x", prompt="prompt of a")]
    with LocalRewardBackend(PROBE, group_size=2) as backend:
        with pytest.raises(
            ScorerRequestError, match="item 'loner' has no group_id, but groups of 2 are declared"
        ):
            backend.compute_rewards(RewardRequest(items=items))


def test_duplicate_and_missing_ids_are_refused_naming_them():
    with pytest.raises(ValidationError, match=re.escape("items[1].id 'x' is not unique")):
        RewardRequest(items=[RewardItem(id="x", text="a"), RewardItem(id="x", text="b")])
    with pytest.raises(ValidationError, match="id"):
        RewardItem(id="", text="a")
    with pytest.raises(GroupInputError, match=re.escape("items[2].id 'x' duplicates items[0].id")):
        partition([ScoreItem(id="x"), ScoreItem(id="y"), ScoreItem(id="x")], None, scorer="s")
    with pytest.raises(GroupInputError, match=re.escape("items[1] has no id")):
        partition([ScoreItem(id="x"), ScoreItem(id="")], None, scorer="s")


def test_a_missing_completion_is_refused_naming_the_id():
    items = [*group("a", 1), RewardItem(id="empty", group_id="b", prompt="p")]
    with LocalRewardBackend(PROBE) as backend:
        with pytest.raises(
            ScorerRequestError, match=r"\(id='empty'\): field 'text' is required by scorer 'probe'"
        ):
            backend.compute_rewards(RewardRequest(items=items))


@pytest.mark.parametrize(
    "field, first, other",
    [
        ("prompt", "What is 6 x 7?", "What is 6 x 8?"),
        ("reference", {"answer": 1}, {"answer": True}),
        ("reference", {"answer": 1}, {"answer": 1.0}),
        ("reference", {"answer": "1"}, {"answer": 1}),
        ("reference", [1, 2], [2, 1]),
        ("data_source", "gsm8k", "math"),
    ],
)
def test_candidates_with_different_common_inputs_are_refused(field, first, other):
    items = group("g", 3, **{field: first})
    items[2] = items[2].model_copy(update={field: other})
    with LocalRewardBackend(PROBE) as backend:
        with pytest.raises(
            ScorerRequestError,
            match=f"group 'g': candidate 'g-2' has a different {field} than 'g-0'",
        ):
            backend.compute_rewards(RewardRequest(items=items))


def test_strict_keys_tell_json_types_apart():
    keys = [strict_key(v) for v in (1, True, 1.0, "1", [1], (1,), {"a": 1}, None)]
    # a JSON list arrives as a list or a tuple
    assert len(set(keys[:4])) == 4 and keys[4] == keys[5]
    assert strict_key({"a": 1, "b": 2}) == strict_key({"b": 2, "a": 1})


def test_common_inputs_reach_a_groupwise_scorer_deeply_frozen(managed, trainer_python):
    reference = {"answer": "42", "steps": [{"n": 1}]}
    frozen = freeze(reference)
    with pytest.raises(TypeError):
        frozen["steps"][0]["n"] = 2
    assert isinstance(frozen["steps"], tuple)
    for backend in both(managed, trainer_python, SPY, group_size=2):
        response = backend.compute_rewards(RewardRequest(items=group("g", 2, reference=reference)))
        assert response.component_rewards["frozen"] == [1.0, 1.0]
        if isinstance(backend, LocalRewardBackend):
            backend.close()
    assert reference == {"answer": "42", "steps": [{"n": 1}]}


# -- chunking --------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["local", "managed"])
def test_chunking_never_splits_a_group(managed, trainer_python, tmp_path, where):
    """GRPO groups of 3 with request_batch_size 4: every call holds whole groups."""
    journal = str(tmp_path / "calls")
    params = {"journal": journal}
    backend = both(
        managed, trainer_python, PROBE, params=params, request_batch_size=4, group_size=3
    )[where == "managed"]
    items = group("a", 3) + group("b", 3) + group("c", 3)
    interleaved = [items[i] for i in (0, 3, 6, 1, 4, 7, 2, 5, 8)]  # groups need not be contiguous
    response = backend.compute_rewards(RewardRequest(items=interleaved))
    assert response.ids == [item.id for item in interleaved]
    assert response.rewards == [2.0] * 9  # len("cK")
    calls = [sorted(ids) for _, ids in journal_calls(journal)]
    assert calls == [["a-0", "a-1", "a-2"], ["b-0", "b-1", "b-2"], ["c-0", "c-1", "c-2"]]
    if where == "local":
        backend.close()


def test_a_group_larger_than_the_batch_size_travels_alone(tmp_path):
    journal = str(tmp_path / "calls")
    with LocalRewardBackend(PROBE, {"journal": journal}, request_batch_size=2) as backend:
        backend.compute_rewards(
            RewardRequest(items=group("big", 5) + group("small", 1), group_size=None)
        )
    assert [len(ids) for _, ids in journal_calls(journal)] == [5, 1]


def test_a_groupwise_scorer_gets_exactly_one_group_per_call():
    items = group("a", 2) + group("b", 2) + group("c", 2)
    with LocalRewardBackend(SPY, request_batch_size=6, group_size=2) as backend:
        response = backend.compute_rewards(RewardRequest(items=items))
    assert response.component_rewards["group_size"] == [2.0] * 6


def test_request_and_config_group_sizes_must_agree():
    with LocalRewardBackend(SPY, group_size=2) as backend:
        with pytest.raises(
            ScorerRequestError, match="request declares group_size 3, the backend's config 2"
        ):
            backend.compute_rewards(RewardRequest(items=group("a", 3), group_size=3))


def test_a_ragged_scorer_takes_groups_of_any_size_until_a_size_is_declared():
    def length(candidate, context):
        return float(len(candidate.text))

    ragged = map_candidates(length, name="length")()
    items = [
        ScoreItem(id=f"{g}{k}", group_id=g, text="x" * k)
        for g, n in (("a", 1), ("b", 3))
        for k in range(n)
    ]
    assert score_checked(ragged, items).terms == {"length": [0.0, 0.0, 1.0, 2.0]}
    # a declared size holds for a pointwise (ragged) scorer too: every incomplete group named
    with pytest.raises(ScoreInputError, match=r"group 'a' has 1 items, expected group_size 2"):
        score_checked(ragged, items, group_size=2)


# -- the comparative judge -------------------------------------------------------------------------
def test_pairwise_judge_in_process_and_managed(managed, trainer_python):
    answers = ["the cat sat on the mat", "the cat sat", "a dog", "the cat sat"]
    items = [
        RewardItem(
            id=f"{g}{k}",
            group_id=g,
            prompt="describe",
            text=text,
            reference="the cat sat on the mat",
        )
        for g in "xy"
        for k, text in enumerate(answers)
    ]
    results = []
    for backend in both(
        managed, trainer_python, "pairwise_judge", params={"inner": "token_f1"}, group_size=4
    ):
        results.append(backend.compute_rewards(RewardRequest(items=items)))
        if isinstance(backend, LocalRewardBackend):
            backend.close()
    local, child = results
    assert local.rewards == child.rewards
    # F1: 1.0, 2/3 (x2), 0: the best wins every comparison, the tie counts half, the worst none
    assert local.rewards[:4] == [1.0, pytest.approx(0.5), 0.0, pytest.approx(0.5)]
    assert local.diagnostics["pairwise_judge"]["values"]["ties"] == 2
    assert local.identity_hash == child.identity_hash


def test_pairwise_judge_refuses_an_inner_groupwise_scorer():
    with pytest.raises(ValueError, match="must score candidates one by one"):
        LocalRewardBackend("pairwise_judge", {"inner": SPY})


# -- item fields -----------------------------------------------------------------------------------
def test_truncation_is_exactly_the_length_verdict():
    verdicts = {
        "length": True,
        "stop": False,
        None: False,
        "LENGTH": False,
        "max_tokens": False,
        "abort": False,
    }
    for reason, truncated in verdicts.items():
        assert RewardItem(id="a", finish_reason=reason).is_length_truncated is truncated
        assert ScoreItem(id="a", finish_reason=reason).is_length_truncated is truncated


def test_item_fields_and_conditioning_media_reach_the_scorer(managed, trainer_python):
    rng = np.random.default_rng(0)
    # 240 KiB: through the shared segment
    source = rng.integers(0, 256, (256, 320, 3), dtype=np.uint8)
    mask = rng.integers(0, 256, (32, 48, 1), dtype=np.uint8)
    clip = rng.integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    items = [
        RewardItem(id="edit", text="t", finish_reason="length", completion_tokens=512,
                   data_source="edits", condition_images=[source, mask], condition_videos=[clip]),
        RewardItem(id="plain", text="t", finish_reason="stop"),
    ]  # fmt: skip
    expected = {
        "tokens": [512.0, -1.0],
        "truncated": [1.0, 0.0],
        "source_len": [5.0, 0.0],
        "condition_sum": [float(int(source.sum()) + int(mask.sum()) + int(clip.sum())), 0.0],
        "condition_count": [3.0, 0.0],
    }
    for backend in both(managed, trainer_python, "tests.helpers.fixture_scorers:EchoFields"):
        assert backend.compute_rewards(RewardRequest(items=items)).component_rewards == expected
        if isinstance(backend, LocalRewardBackend):
            backend.close()


def test_conditioning_media_are_checked_like_media():
    with pytest.raises(ValidationError, match="uint8 HWC"):
        RewardItem(id="a", text="t", condition_images=[np.zeros((4, 4, 3), np.float32)])
    with pytest.raises(ValidationError, match="list of images"):
        RewardItem(id="a", text="t", condition_images=np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(ValidationError):
        RewardItem(id="a", text="t", completion_tokens=-1)


def test_an_edit_reward_needs_its_source_image():
    def brighter(candidate, context):
        return float(candidate.image.mean() > candidate.condition_images[0].mean())

    edit = map_candidates(brighter, name="brighter", input_kind="image_edit")()
    image = np.full((4, 4, 3), 200, np.uint8)
    source = np.full((4, 4, 3), 100, np.uint8)
    assert score_checked(
        edit, [ScoreItem(id="e", image=image, condition_images=(source,))]
    ).terms == {"brighter": [1.0]}
    with pytest.raises(
        ScoreInputError, match=r"\(id='e'\): image_edit scorer 'brighter' needs the source image"
    ):
        score_checked(edit, [ScoreItem(id="e", image=image)])
