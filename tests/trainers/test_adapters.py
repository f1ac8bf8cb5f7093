"""Adapters to the call shapes of TRL, verl and DDPO / flow-GRPO (shared/TRAINERS.md)."""

from __future__ import annotations

import asyncio
import math
import pickle
import threading

import numpy as np
import pytest

from supervisor import (
    ConfigError,
    LocalRewardBackend,
    PanelTerm,
    RewardItem,
    RewardPanel,
    RewardRequest,
    ScorerRequestError,
)
from supervisor.adapters import items as adapter_items
from supervisor.adapters.ddpo import DDPORewardFn
from supervisor.adapters.images import to_uint8_hwc
from supervisor.adapters.trl import TRLRewardFunction, completion_text
from supervisor.adapters.verl import VerlComputeScore

RNG = np.random.default_rng(0)


# -- images -------------------------------------------------------------------------------------
@pytest.mark.parametrize("output_range, low", [("zero_one", 0.0), ("neg_one_to_one", -1.0)])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_float_images_become_exact_uint8_hwc(output_range, low, layout):
    unit = RNG.random((3, 8, 6, 3), dtype=np.float32)  # NHWC in [0, 1]
    images = unit * (1.0 - low) + low
    if layout == "NCHW":
        images = images.transpose(0, 3, 1, 2)
    out = to_uint8_hwc(images, output_range, layout)
    assert out.dtype == np.uint8 and out.shape == (3, 8, 6, 3)
    expected = np.floor(
        ((np.clip(unit * (1.0 - low) + low, low, 1.0) - low) * (255.0 / (1.0 - low))) + 0.5
    )
    # fp32 vs this fp64 oracle at .5 ties
    assert np.abs(out.astype(int) - expected.astype(int)).max() <= 1
    assert (to_uint8_hwc(out, output_range, "NHWC") == out).all()  # uint8 passes unchanged


def test_out_of_range_or_non_finite_images_are_refused_naming_the_image():
    images = RNG.random((2, 3, 4, 4), dtype=np.float32)
    images[1, 0, 0, 0] = 1.2
    with pytest.raises(
        ScorerRequestError, match=r"image 1 spans .* outside the declared zero_one range"
    ):
        to_uint8_hwc(images, "zero_one")
    images[1, 0, 0, 0] = np.nan
    with pytest.raises(ScorerRequestError, match="image 1 has non-finite values"):
        to_uint8_hwc(images, "zero_one")
    with pytest.raises(ScorerRequestError, match="is the layout right"):
        to_uint8_hwc(RNG.random((2, 8, 8, 3), dtype=np.float32), "zero_one", "NCHW")
    # a decoder's overshoot within tolerance: clamped
    slight = np.full((1, 3, 2, 2), 1.0005, np.float32)
    assert (to_uint8_hwc(slight, "zero_one") == 255).all()


def test_ddpo_reward_fn_scores_float_nchw_through_a_managed_childs_arena(managed, image_python):
    backend = managed(image_python, "jpeg_compressibility", "image")
    reward_fn = DDPORewardFn(backend, output_range="zero_one")
    images = RNG.random((2, 3, 64, 64), dtype=np.float32)
    segment = backend._gen.segment
    rewards, info = reward_fn(images, ["a cat", "a dog"], [{}, {}])
    # built in the arena, sent in place
    assert segment.in_place_bytes == 2 * 64 * 64 * 3 and segment.copied_bytes == 0
    assert reward_fn.__name__ == "jpeg_compressibility"
    with LocalRewardBackend("jpeg_compressibility") as local:
        expected, _ = DDPORewardFn(local, output_range="zero_one")(
            images, ["a cat", "a dog"], [{}, {}]
        )
    assert rewards.tolist() == expected.tolist() and rewards.dtype == np.float32
    assert info["metrics"]["train/reward/jpeg_compressibility/sample_count"] == 2.0


def test_flow_grpo_style_returns_each_term_and_the_weighted_avg():
    images = RNG.random((2, 3, 32, 32), dtype=np.float32)
    with LocalRewardBackend("jpeg_compressibility") as backend:
        expected, _ = DDPORewardFn(backend, output_range="zero_one")(images, ["a", "b"], [{}, {}])
        reward_fn = DDPORewardFn(backend, output_range="zero_one", style="flow_grpo")
        # flow_grpo's call
        details, extra = reward_fn(images, ["a", "b"], [{}, {}], only_strict=True)
    assert extra == {} and details["avg"] == pytest.approx(expected.tolist())
    assert details["jpeg_compressibility"] == details["avg"]
    with pytest.raises(ValueError, match="style"):
        DDPORewardFn(backend, output_range="zero_one", style="flow")


# -- verl ------------------------------------------------------------------------------------------
def test_verl_dicts_have_the_same_keys_on_every_item_and_a_score_term_is_refused():
    """verl reads the keys of the first item's dict and indexes every item by them."""
    terms = [
        PanelTerm("exact", LocalRewardBackend("exact_match"), weight=2.0),
        PanelTerm("math_only", LocalRewardBackend("constant"), applicable_datasets=["math"]),
    ]
    with RewardPanel(terms) as panel:
        batch = VerlComputeScore(panel).compute_score_batch(
            ["gsm8k", "math"], ["1", "1"], ["1", "2"]
        )
    assert [sorted(row) for row in batch] == [["exact", "math_only", "score"]] * 2
    # not applicable: NaN in the log column
    assert batch[0]["score"] == 2.0 and math.isnan(batch[0]["math_only"])
    assert batch[1] == {"score": 1.0, "exact": 0.0, "math_only": 1.0}
    # verl's legacy prime manager reads float(result[0]); index 0 is the score, never a listed key
    assert (
        batch[1][0] == 1.0 and 0 not in batch[1] and pickle.loads(pickle.dumps(batch[1]))[0] == 1.0
    )
    with pytest.raises(KeyError):
        batch[1]["missing"]
    with RewardPanel([PanelTerm("score", LocalRewardBackend("exact_match"), weight=2.0)]) as panel:
        with pytest.raises(ConfigError, match="a term named 'score' would hide the reward"):
            VerlComputeScore(panel)("gsm8k", "1", "1")


def test_verl_omni_solution_image_is_read_as_chw():
    hwc = (RNG.random((16, 12, 3)) * 255).astype(np.uint8)
    with LocalRewardBackend("jpeg_compressibility") as backend:
        compute_score = VerlComputeScore(backend)
        from_chw = compute_score(
            data_source="geneval", solution_image=hwc.transpose(2, 0, 1), ground_truth="a cat"
        )
        expected = backend.compute_rewards(
            RewardRequest(items=[RewardItem(id="x", image=hwc)])
        ).rewards[0]
        assert from_chw["score"] == expected
        with pytest.raises(ScorerRequestError, match="one CHW image"):
            compute_score(
                data_source="geneval",
                solution_image=hwc[None].transpose(0, 3, 1, 2),
                ground_truth=None,
            )


def test_verl_compute_score_per_item_async_and_batch():
    with LocalRewardBackend("exact_match") as backend:
        compute_score = VerlComputeScore(backend)
        assert compute_score("gsm8k", "42", "42", {"index": 7}) == {
            "score": 1.0,
            "exact_match": 1.0,
        }
        assert compute_score("gsm8k", "41", "42") == {"score": 0.0, "exact_match": 0.0}

        async def both() -> list[dict]:
            return list(
                await asyncio.gather(
                    compute_score.acompute_score("gsm8k", "42", "42", {}),
                    compute_score.acompute_score("m", "x", "y"),
                )
            )

        assert [r["score"] for r in asyncio.run(both())] == [1.0, 0.0]
        batch = compute_score.compute_score_batch(
            ["a", "b"], ["x", "y"], ["x", "z"], [{"index": 0}, {"index": 1}]
        )
        assert [r["score"] for r in batch] == [1.0, 0.0]
        with pytest.raises(ValueError, match="differ in length"):
            compute_score.compute_score_batch(["a"], ["x", "y"], ["x", "z"])


def test_verl_first_step_boots_once_on_one_thread_and_every_task_resumes_together():
    """18 rollouts of the step that boots: one build, on one executor thread (the loop's other
    to_thread work still runs meanwhile), and all 18 resume in one loop turn, so they reach the
    stream as one window however slowly a loaded machine runs the threads."""
    from concurrent.futures import ThreadPoolExecutor

    from supervisor.adapters.verl import aprocess_scorer

    release, builds = threading.Event(), []

    def build() -> LocalRewardBackend:
        builds.append(threading.get_ident())
        assert release.wait(10), "the test never released the boot"
        return LocalRewardBackend("exact_match")

    async def step() -> list[int]:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=2))
        turns = 0

        async def ticker() -> None:
            nonlocal turns
            while True:
                await asyncio.sleep(0)
                turns += 1

        async def rollout(i: int) -> tuple[int, dict]:
            scorer = await aprocess_scorer(("test-boot", str(id(release))), build)
            return turns, await scorer.acompute_score("gsm8k", str(i % 2), "0", {"index": i})

        ticking = asyncio.create_task(ticker())
        rollouts = asyncio.gather(*(rollout(i) for i in range(18)))
        # the boot blocks one thread: another thread job of this loop still runs
        assert await asyncio.wait_for(asyncio.to_thread(lambda: 7), 5) == 7
        release.set()
        done = await asyncio.wait_for(rollouts, 30)
        ticking.cancel()
        assert [row["score"] for _, row in done] == [1.0, 0.0] * 9
        return [turn for turn, _ in done]

    resumed = asyncio.run(step())
    assert len(builds) == 1 and len(set(resumed)) == 1, (builds, resumed)


# -- TRL -------------------------------------------------------------------------------------------
def test_completion_text_plain_and_conversational():
    assert completion_text("plain") == "plain"
    assert completion_text([{"role": "assistant", "content": "chat"}]) == "chat"
    parts = [
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        }
    ]
    assert completion_text(parts) == "ab"
    with pytest.raises(ScorerRequestError, match="must be a string or a list of chat messages"):
        completion_text(42)


def test_what_a_trainer_hands_over_that_cannot_be_scored_is_a_typed_error_naming_the_item():
    """TRL: a tool call's message (content None) and an empty message list; DDPO: no images at all;
    verl's parquet rows give numpy ground truths, which are plain values, not an error."""
    tool_call = [
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "search"}}]}
    ]
    with LocalRewardBackend("exact_match") as backend:
        reward = TRLRewardFunction(backend, close_at_exit=False)
        for completion, message in (
            (tool_call, "TRL completion 1: .* NoneType \\(a tool call\\)"),
            ([], "TRL completion 1 is an empty list"),
        ):
            with pytest.raises(ScorerRequestError, match=message) as info:
                reward(prompts=["p", "p"], completions=["x", completion])
            assert info.value.kind == "bad_input"
        compute_score = VerlComputeScore(backend)
        assert compute_score("gsm8k", "42", np.str_("42"))["score"] == 1.0
        assert compute_score("gsm8k", "7", np.int64(7))["score"] == 1.0
        accepted = adapter_items.item(
            "x", id="x", text="42", reference={"answers": np.array(["42", "forty-two"])}
        )
        assert accepted.reference == {"answers": ["42", "forty-two"]}
        with pytest.raises(ScorerRequestError, match="verl item .*: reference"):
            compute_score("gsm8k", "7", {1, 2})
    with LocalRewardBackend("jpeg_compressibility") as backend:
        with pytest.raises(ScorerRequestError, match="ddpo reward_fn was called with no items"):
            DDPORewardFn(backend, output_range="zero_one")(
                np.zeros((0, 3, 8, 8), np.float32), [], []
            )


@pytest.mark.parametrize("conversational", [False, True])
def test_trl_reward_function_maps_keyword_arguments(conversational):
    def wrap(text: str):
        return [{"role": "assistant", "content": text}] if conversational else text

    with LocalRewardBackend("exact_match") as backend:
        reward = TRLRewardFunction(backend, close_at_exit=False)
        logged: dict[str, float] = {}
        rewards = reward(
            prompts=["q1", "q1", "q2", "q2"],
            completions=[wrap("4"), wrap("5"), wrap("x"), wrap("x")],
            completion_ids=[[1], [2], [3], [4]],
            answer=["4", "4", "x", "y"],
            trainer_state=None,
            log_metric=lambda name, value: logged.__setitem__(name, value),
        )
        assert rewards == [1.0, 0.0, 1.0, 0.0] and reward.__name__ == "exact_match"
        assert logged["train/reward/exact_match/sample_count"] == 4.0
        async_reward = reward.as_async()
        assert asyncio.iscoroutinefunction(async_reward) and async_reward.__name__ == "exact_match"
        assert asyncio.run(async_reward(prompts=["q"], completions=[wrap("4")], answer=["4"])) == [
            1.0
        ]


def test_trl_completion_ids_become_token_counts_and_data_source_passes_through():
    with LocalRewardBackend("tests.helpers.fixture_scorers:EchoFields") as backend:
        reward = TRLRewardFunction(backend, close_at_exit=False)
        request = reward._request(
            ["q", "q"], ["a", "b"], [[5, 6, 7], []], {"data_source": ["gsm8k", "math"]}
        )
        assert [item.completion_tokens for item in request.items] == [3, 0]
        assert [item.data_source for item in request.items] == ["gsm8k", "math"]
        response = backend.compute_rewards(request)
        assert response.component_rewards["tokens"] == [3.0, 0.0]
        assert response.component_rewards["source_len"] == [5.0, 4.0]
        with pytest.raises(ValueError, match="1 completion_ids for 2 completions"):
            reward(prompts=["q", "q"], completions=["a", "b"], completion_ids=[[1]])


def test_trl_groupwise_scorer_gets_groups_from_trls_layout(monkeypatch):
    with LocalRewardBackend("pairwise_judge", {"inner": "token_f1"}) as backend:
        with pytest.raises(ConfigError, match="needs num_generations"):
            TRLRewardFunction(backend, close_at_exit=False)
        reward = TRLRewardFunction(backend, num_generations=2, close_at_exit=False)
        rewards = reward(
            prompts=["p", "p", "q", "q"],
            completions=["a b", "a", "c", "d"],
            solution=["a b"] * 2 + ["c"] * 2,
        )
        assert rewards == [1.0, 0.0, 1.0, 0.0]
        monkeypatch.setenv("WORLD_SIZE", "2")
        with pytest.raises(ConfigError, match="a group can span processes"):
            reward(prompts=["p", "p"], completions=["a", "b"], solution=["a", "a"])


class _Trainer:
    """Stands for TRL's trainer: `log_metric` is one of its methods, `model.training` its mode."""

    def __init__(self, training: bool) -> None:
        self.model = type("Model", (), {"training": training})()
        self.logged: dict[str, float] = {}

    def _log_metric(self, name: str, value: float) -> None:
        self.logged[name] = value


def test_trl_eval_groups_use_num_generations_eval_checked_on_the_whole_prompt():
    with LocalRewardBackend("pairwise_judge", {"inner": "token_f1"}) as backend:
        reward = TRLRewardFunction(
            backend, num_generations=4, num_generations_eval=2, close_at_exit=False
        )
        completions, golds = ["a b", "a", "c", "d"], ["a b"] * 2 + ["c"] * 2
        assert reward(prompts=["p", "p", "q", "q"], completions=completions, solution=golds) == [
            1.0,
            0.0,
            1.0,
            0.0,
        ]
        with pytest.raises(ConfigError, match="not whole runs of one prompt"):
            reward(prompts=["p", "p", "q", "p"], completions=completions, solution=golds)

        # conversational prompts that differ only before their last message are different prompts
        def chat(system: str) -> list[dict]:
            return [
                {"role": "system", "content": system},
                {"role": "user", "content": "same question"},
            ]

        mixed = [chat("x"), chat("x"), chat("y"), chat("y")]
        assert reward(
            prompts=mixed, completions=["a b", "a", "a b", "b"], solution=["a b"] * 4
        ) == [1.0, 0.0, 1.0, 0.0]

        # one prompt in all four rows fits both sizes: the trainer's mode decides, unknown is
        # refused
        same = ["p"] * 4
        with pytest.raises(ConfigError, match="fit groups of 4 and of 2"):
            reward(prompts=same, completions=["a b", "a", "a b", "b"], solution=["a b"] * 4)
        one_group = reward(
            prompts=same,
            completions=["a b", "a", "a b", "b"],
            solution=["a b"] * 4,
            log_metric=_Trainer(True)._log_metric,
        )
        pairs = reward(
            prompts=same,
            completions=["a b", "a", "a b", "b"],
            solution=["a b"] * 4,
            log_metric=_Trainer(False)._log_metric,
        )
        assert pairs == [1.0, 0.0, 1.0, 0.0] and one_group != pairs


def test_trl_panel_with_a_groupwise_term_gets_groups_like_a_groupwise_scorer():
    """A panel's groupwise term gets TRL's groups rebuilt too; its rewards are the terms' own,
    summed."""
    exact, judge = (
        LocalRewardBackend("exact_match"),
        LocalRewardBackend("pairwise_judge", {"inner": "token_f1"}),
    )
    panel = RewardPanel(
        [PanelTerm("exact", exact), PanelTerm("judge", judge, weight=0.5)], owns_backends=False
    )
    with exact, judge:
        with pytest.raises(ConfigError, match="needs num_generations"):
            TRLRewardFunction(panel, close_at_exit=False)
        reward = TRLRewardFunction(panel, num_generations=2, close_at_exit=False)
        prompts, completions, golds = (
            ["p", "p", "q", "q"],
            ["a b", "a", "c", "d"],
            ["a b"] * 2 + ["c"] * 2,
        )
        got = reward(prompts=prompts, completions=completions, solution=golds)
        items = [
            RewardItem(id=f"x{i}", group_id=f"g{i // 2}", text=c, reference=g)
            for i, (c, g) in enumerate(zip(completions, golds, strict=True))
        ]
        direct = [
            e + 0.5 * j
            for e, j in zip(
                exact.compute_rewards(RewardRequest(items=items, group_size=2)).rewards,
                judge.compute_rewards(RewardRequest(items=items, group_size=2)).rewards,
                strict=True,
            )
        ]
        assert got == direct == [1.5, 0.0, 1.5, 0.0]
