"""FF-style reward models (scorers.ff) run by dotted path in managed children, from an FF `rewards:`
recipe: the chunks, fields and media kinds the model sees, gating, weights, and the contract
checks."""

from __future__ import annotations

import json
import subprocess
import textwrap
import threading
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml

from scorers.base import ScoreItem, ScorerContractError, score_checked
from scorers.ff import RewardModelConfigError, RewardModelError
from scorers.ff.scorer import FfModelScorer
from supervisor import (
    ConfigError,
    ManagedScorerProcessBackend,
    RewardItem,
    RewardRequest,
    ScorerRequestError,
    build_panels,
    load_recipe,
)
from tests.conftest import REPO_ROOT, env_python, eventually, launcher_free_env, wait_until_gone
from tests.helpers.ff_models import SlowBrightness, brightness, group_images

HELPERS = "tests.helpers.ff_models"
WEIGHTS = {"a": 2.0, "b": 0.5}


def _items() -> list[RewardItem]:
    """Seven items the FF model applies to (datasets a, b) and two it does not (c), interleaved."""
    rng = np.random.default_rng(3)
    sources = ["a", "b", "c", "a", "b", "a", "c", "b", "a"]
    return [
        RewardItem(
            id=f"i{i}",
            prompt=f"prompt {i}",
            image=rng.integers(0, 256, (8, 6, 3), dtype=np.uint8),
            condition_images=[
                rng.integers(0, 256, (4 + k, 5, 3), dtype=np.uint8) for k in range(i % 3 + 1)
            ],
            metadata={"bonus": i / 100},
            data_source=source,
        )
        for i, source in enumerate(sources)
    ]


def _hand(item: RewardItem) -> float:
    return brightness(item.image) + 0.1 * len(item.condition_images) + float(item.metadata["bonus"])


def _recipe(tmp_path: Path) -> Path:
    brightness_model = {
        "reward_model": f"{HELPERS}:Brightness",
        "batch_size": 3,
        "dtype": "float32",
    }
    recipe = {
        "rewards": [
            {
                "name": "brightness",
                **brightness_model,
                "env": "image",
                "extra_import_paths": [str(REPO_ROOT)],
                "applicable_datasets": ["a", "b"],
                "weight": WEIGHTS,
                "journal": str(tmp_path / "managed.jsonl"),
            },
            {
                "name": "intensity",
                "reward_model": "mean_intensity",
                "backend": "local",
                "weight": 1.0,
            },
        ],
        "eval_rewards": [
            {
                "name": "brightness_here",
                **brightness_model,
                "backend": "local",
                "journal": str(tmp_path / "local.jsonl"),
            }
        ],
    }
    path = tmp_path / "ff.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _journal(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_an_ff_pointwise_model_in_its_env_scores_as_in_process_with_chunks_gating_and_weights(
    tmp_path,
):
    recipe = load_recipe(_recipe(tmp_path))
    assert recipe.style == "ff" and recipe.validation is not None
    items = _items()
    request = RewardRequest(items=items)
    train, validation = build_panels(recipe)
    try:
        got = train.compute_rewards(request)
        child = train.terms[0].backend
        assert isinstance(child, ManagedScorerProcessBackend) and "envs/image/" in str(
            child.spec.process.python_executable
        )
        here = validation.compute_rewards(request)  # the same class in the trainer's process
        applies = [item.data_source in WEIGHTS for item in items]
        managed = got.component_rewards["brightness"]
        assert [value is not None for value in managed] == applies  # gated by applicable_datasets
        assert managed == [
            h if a else None
            for h, a in zip(here.component_rewards["brightness_here"], applies, strict=True)
        ]
        assert managed == [
            pytest.approx(_hand(it)) if a else None for it, a in zip(items, applies, strict=True)
        ]
        intensity = [float(it.image.mean()) / 255 for it in items]
        expected = [
            WEIGHTS.get(it.data_source, 0.0) * _hand(it) + v
            for it, v in zip(items, intensity, strict=True)
        ]
        # per-dataset weight on one term, a scalar on the other
        assert got.rewards == pytest.approx(expected)
        seen = _journal(tmp_path / "managed.jsonl")
        assert [call["n"] for call in seen] == [3, 3, 1]  # at most batch_size, the tail smaller
        gated = [it for it in items if it.data_source in WEIGHTS]
        # in order
        assert [p for call in seen for p in call["prompts"]] == [it.prompt for it in gated]
        assert [n for call in seen for n in call["conditions"]] == [
            len(it.condition_images) for it in gated
        ]
        assert {call["device"] for call in seen} == {"cpu"}  # a str: the image env has no torch
        assert [call["n"] for call in _journal(tmp_path / "local.jsonl")] == [3, 3, 3]
        poisoned = RewardItem(id="nan", prompt="p", image=items[0].image,
                              condition_images=items[0].condition_images,
                              metadata={"nan": True}, data_source="a")  # fmt: skip
        with pytest.raises(
            ScorerRequestError, match=r"\(contract\).*ff_models:Brightness'.*non-finite reward nan"
        ):
            train.compute_rewards(RewardRequest(items=[poisoned]))
        assert train.compute_rewards(request).rewards == got.rewards  # the child keeps serving
    finally:
        train.close()
        validation.close()


IN_PROCESS = textwrap.dedent(
    """
    import json, sys
    from scorers.base import ScoreItem, score_checked
    from scorers.ff.scorer import FfModelScorer
    from tests.helpers.ff_models import group_images

    groups = json.loads(sys.argv[2])
    scorer = FfModelScorer(
        model="tests.helpers.ff_models:GroupRank", model_path=sys.argv[1], dtype="bfloat16"
    )
    scorer.load("cpu")
    items = [
        ScoreItem(id=f"g{i}", group_id=g, image=image)
        for i, (g, image) in enumerate(zip(groups, group_images(len(groups))))
    ]
    print(json.dumps(score_checked(scorer, items).terms["ff_model"]))
    """
)


@pytest.mark.slow
def test_an_ff_groupwise_tensor_model_gets_whole_groups_and_matches_in_process(tmp_path):
    offset = tmp_path / "offset.txt"
    offset.write_text("0.25")
    groups = ["x", "y", "x", "z", "y", "x", "z", "y", "x", "y", "z"]  # 4 + 4 + 3, interleaved
    entry = {
        "name": "rank",
        "reward_model": f"{HELPERS}:GroupRank",
        "model_path": str(offset),
        "dtype": "bfloat16",
        "env": "embed",
        "extra_import_paths": [str(REPO_ROOT)],
        "journal": str(tmp_path / "groups.jsonl"),
    }
    train, validation = build_panels(load_recipe({"rewards": [entry]}))
    assert validation is None
    images = group_images(len(groups))
    request = RewardRequest(
        items=[
            RewardItem(id=f"g{i}", group_id=g, image=img)
            for i, (g, img) in enumerate(zip(groups, images, strict=True))
        ]
    )
    try:
        got = train.compute_rewards(request).rewards
    finally:
        train.close()
    calls = _journal(tmp_path / "groups.jsonl")
    assert sorted(call["n"] for call in calls) == [3, 4, 4] and {c["dtype"] for c in calls} == {
        "torch.bfloat16"
    }
    hand = []
    for i, group in enumerate(groups):
        members = [j for j, g in enumerate(groups) if g == group]
        means = [float(images[j].astype(np.float64).mean()) for j in members]
        hand.append(sorted(means).index(means[members.index(i)]) / (len(members) - 1) + 0.25)
    assert got == pytest.approx(hand)
    done = subprocess.run(
        [str(env_python("embed")), "-c", IN_PROCESS, str(offset), json.dumps(groups)],
        cwd=tmp_path,
        env=launcher_free_env(PYTHONPATH=str(REPO_ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert got == json.loads(done.stdout.splitlines()[-1])


def _score_items(count: int) -> list[ScoreItem]:
    return [
        ScoreItem(
            id=f"s{i}",
            prompt="p",
            image=item.image,
            condition_images=item.condition_images,
            metadata={},
        )
        for i, item in enumerate((_items() * 2)[:count])
    ]


def test_a_model_that_is_not_thread_safe_refuses_more_than_one_worker():
    with pytest.raises(
        RewardModelConfigError, match=r"UnsafeBrightness.*thread_safe = False.*num_workers"
    ):
        FfModelScorer(model=f"{HELPERS}:UnsafeBrightness", async_reward=True, num_workers=2)
    FfModelScorer(model=f"{HELPERS}:UnsafeBrightness", num_workers=1)


def test_async_workers_run_a_requests_chunks_at_once_in_order():
    scorer = FfModelScorer(
        model=f"{HELPERS}:SlowBrightness", batch_size=2, async_reward=True, num_workers=2
    )
    assert scorer.spec.concurrent_calls == 2
    scorer.load("cpu")
    try:
        items = _score_items(7)
        result = score_checked(scorer, items)
    finally:
        scorer.close()
    assert SlowBrightness.most == 2
    assert result.terms["ff_model"] == pytest.approx([_hand_score(it) for it in items])


def _hand_score(item: ScoreItem) -> float:
    return brightness(item.image) + 0.1 * len(item.condition_images)


def test_an_audio_model_gets_float32_numpy_channels_by_samples_and_the_rate():
    scorer = FfModelScorer(model=f"{HELPERS}:AudioModel", batch_size=2)
    assert (scorer.spec.input_kind, scorer.spec.required_fields) == ("audio", ("audio",))
    waves = [
        np.zeros((1, 800), np.float32),
        np.ones((2, 16000), np.float32),
        np.zeros((6, 4000), np.float32),
    ]
    items = [ScoreItem(id=f"a{i}", audio=w, audio_sample_rate=16000) for i, w in enumerate(waves)]
    scorer.load("cpu")
    try:
        result = score_checked(scorer, items)
    finally:
        scorer.close()
    assert result.terms["ff_model"] == pytest.approx([0.05 + 0.1, 1.0 + 0.2, 0.25 + 0.6])


@pytest.mark.slow
def test_with_tensor_inputs_audio_arrives_as_a_private_float32_tensor_in_an_env_with_torch():
    code = textwrap.dedent(
        """
        import numpy as np, torch
        from scorers.base import ScoreItem
        from scorers.ff.inputs import model_inputs

        wave = np.arange(6, dtype=np.float32).reshape(2, 3)
        wave.flags.writeable = False  # as the child hands it over: a read-only view
        got = model_inputs(
            [ScoreItem(id="a", audio=wave, audio_sample_rate=8000)],
            ("audio", "audio_sample_rate"),
            True,
        )
        tensor = got["audio"][0]
        assert (
            isinstance(tensor, torch.Tensor)
            and tensor.dtype == torch.float32
            and tuple(tensor.shape) == (2, 3)
        )
        assert tensor.numpy().tobytes() == wave.tobytes() and not np.shares_memory(
            tensor.numpy(), wave
        )
        assert got["audio_sample_rate"] == [8000]
        print("ok")
        """
    )
    done = subprocess.run(
        [str(env_python("embed")), "-c", code],
        cwd=REPO_ROOT,
        env=launcher_free_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_unknown_fields_and_classes_are_refused_naming_the_model():
    with pytest.raises(RewardModelConfigError, match=r"Unknown.*has 'speech'"):
        FfModelScorer(model=f"{HELPERS}:Unknown")
    with pytest.raises(RewardModelConfigError, match="not a PointwiseRewardModel"):
        FfModelScorer(model="tests.helpers.ff_models:brightness")


def test_wrong_length_is_a_contract_error_naming_the_model():
    scorer = FfModelScorer(model=f"{HELPERS}:WrongLength", batch_size=4)
    scorer.load("cpu")
    with pytest.raises(RewardModelError, match=r"WrongLength.*shape \[4\] for 3 inputs") as info:
        score_checked(scorer, _score_items(3))
    assert isinstance(info.value, ScorerContractError)


def test_an_ff_model_class_must_say_where_it_runs_and_registered_scorers_refuse_model_keys():
    with pytest.raises(ConfigError, match=r"rewards\[0\] \(m\): say where the model runs"):
        load_recipe({"rewards": [{"name": "m", "reward_model": f"{HELPERS}:Brightness"}]})
    with pytest.raises(ConfigError, match=r"\['model_path'\] configure a model class"):
        load_recipe(
            {"rewards": [{"name": "m", "reward_model": "mean_intensity", "model_path": "/x"}]}
        )
    recipe = load_recipe(
        {
            "rewards": {
                "name": "m",
                "reward_model": f"{HELPERS}:Brightness",
                "env": "image",
                "threshold": 0.5,
            }
        }
    )
    (term,) = recipe.train.terms
    assert term.backend.scorer.params == {
        "model": f"{HELPERS}:Brightness",
        "params": {"threshold": 0.5},
        "name": "m",  # FF's config.name: the entry's
    }


def _hang_items(hangs: list[bool], prefix: str = "h") -> list[ScoreItem]:
    return [
        ScoreItem(id=f"{prefix}{i}", prompt="p" * (i + 1), text="t", metadata={"hang": hang})
        for i, hang in enumerate(hangs)
    ]


def test_a_call_past_its_deadline_wedges_the_workers_and_calls_queued_behind_it_say_queued():
    """Two workers stuck in a call's chunks past call_timeout_s: that call is wedged (its own
    deadline passed), a concurrent call whose chunks queued behind them fails at once as never
    started, not at its own deadline as a timeout, and so does every later call (item 4)."""
    from scorers.base import ScorerWedged
    from tests.helpers.term_faults import Hangs

    Hangs.release.clear()
    scorer = FfModelScorer(
        model="tests.helpers.term_faults:Hangs",
        batch_size=1,
        async_reward=True,
        num_workers=2,
        call_timeout_s=1.0,
    )
    scorer.load("cpu")
    outcomes: dict[str, BaseException | None] = {}

    def call(name: str, items: list[ScoreItem]) -> None:
        try:
            scorer.score(items)
            outcomes[name] = None
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            outcomes[name] = exc

    try:
        first = threading.Thread(
            target=call, args=("first", _hang_items([True, True, False, False]))
        )
        first.start()
        # both workers are in the first call's hanging chunks
        assert eventually(lambda: Hangs.running == 2)
        queued = threading.Thread(target=call, args=("queued", _hang_items([False, False], "q")))
        queued.start()
        first.join(30)
        queued.join(30)
        wedged, behind = outcomes["first"], outcomes["queued"]
        assert isinstance(wedged, ScorerWedged) and wedged.timed_out, repr(wedged)
        assert "2 still ran after call_timeout_s=1.0 (2 never started, queued)" in str(wedged)
        assert isinstance(behind, ScorerWedged) and not behind.timed_out, repr(behind)
        assert "2 of this call's 2 chunks never started (queued behind another call)" in str(behind)
        with pytest.raises(ScorerWedged, match="this call never started") as later:
            scorer.score(_hang_items([False, False], "l"))
        assert not later.value.timed_out
    finally:
        Hangs.release.set()  # the stuck threads end; in a child they die with it
        scorer.close()


def test_a_wedged_child_is_restarted_under_the_policy_and_the_next_call_is_served(
    managed, trainer_python
):
    """An FF model on async workers whose call passes call_timeout_s with chunks still running: the
    call fails once, typed (ScorerTimeout, kind `wedged`, its queued chunks said queued), the child
    is killed with its stuck threads, and the next call gets a restarted child, counted by the
    restart policy (item 4: every later call used to fail at call_timeout_s on the same child)."""
    from supervisor import ScorerTimeout

    params = {"model": "tests.helpers.term_faults:Hangs", "batch_size": 1, "async_reward": True}
    scorer = "scorers.ff.scorer:FfModelScorer"
    backend = managed(
        trainer_python, scorer, params={**params, "num_workers": 2, "call_timeout_s": 0.5}
    )
    stuck = backend.pid

    def request(hangs: list[bool]) -> RewardRequest:
        return RewardRequest(
            items=[
                RewardItem(id=f"r{i}", prompt="p" * (i + 1), text="t", metadata={"hang": h})
                for i, h in enumerate(hangs)
            ]
        )

    with pytest.raises(
        ScorerTimeout, match=r"\(wedged\).*2 still ran after call_timeout_s=0.5 \(1 never started"
    ) as e:
        backend.compute_rewards(request([True, True, False]))
    assert e.value.pid == stuck and backend.timeouts == 1
    assert wait_until_gone([stuck], 10) == []  # killed, its stuck threads with it
    assert backend.compute_rewards(request([False, False, False])).rewards == [1.0, 2.0, 3.0]
    assert backend.pid != stuck and backend.restarts == 1


def test_short_names_register_model_classes_and_refuse_what_would_be_ambiguous():
    from scorers.ff import register_reward_model, reward_model_path, unregister_reward_model
    from tests.helpers.ff_models import Brightness

    try:
        assert register_reward_model("Bright_Test")(Brightness) is Brightness  # FF's decorator
        assert reward_model_path("bright_test") == f"{HELPERS}:Brightness"  # any case
        entry = {"name": "b", "reward_model": "BRIGHT_TEST", "env": "image"}
        (term,) = load_recipe({"rewards": [entry]}).train.terms
        assert term.backend.scorer.params["model"] == f"{HELPERS}:Brightness"  # the child imports
        with pytest.raises(RewardModelConfigError, match="already registered"):
            register_reward_model("bright_test", f"{HELPERS}:WrongLength")
        with pytest.raises(RewardModelConfigError, match="scorer of this project's registry"):
            register_reward_model("mean_intensity", f"{HELPERS}:Brightness")
        with pytest.raises(RewardModelConfigError, match="without '.' or ':'"):
            register_reward_model("my.reward", f"{HELPERS}:Brightness")
        with pytest.raises(RewardModelConfigError, match="not a reward model class"):
            register_reward_model("plain")(dict)
    finally:
        unregister_reward_model("bright_test")
    assert reward_model_path("bright_test") is None


@pytest.mark.slow
def test_train_and_eval_entries_of_one_model_share_one_child_at_their_own_batch_sizes(tmp_path):
    """FF's recipe shape: a short name a module registered, in `rewards:` (batch 2) and
    `eval_rewards:` (batch 4): one child, one load, config.name FF's, each entry's own chunks."""
    from scorers.ff import register_reward_model, unregister_reward_model

    journal = tmp_path / "shared.jsonl"
    entry = {"reward_model": "Shared_Brightness", "env": "image", "dtype": "float32",
             "extra_import_paths": [str(REPO_ROOT)], "journal": str(journal)}  # fmt: skip
    recipe = {
        "rewards": [{**entry, "name": "bright", "batch_size": 2}],
        "eval_rewards": [{**entry, "name": "bright_eval", "batch_size": 4, "weight": 0.5}],
    }
    register_reward_model("shared_brightness", f"{HELPERS}:SharedBrightness")
    items = _items()[:5]
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    try:
        train, validation = build_panels(load_recipe(recipe))
    finally:
        unregister_reward_model("shared_brightness")
    with train, validation:
        children = [p for p in psutil.Process().children() if p.pid not in before]
        assert len(children) == 1  # one child for both entries
        got = train.compute_rewards(RewardRequest(items=items)).rewards
        here = validation.compute_rewards(RewardRequest(items=items)).rewards
    assert wait_until_gone([children[0].pid], 10.0) == []
    assert got == pytest.approx([_hand(item) for item in items])
    assert here == pytest.approx([0.5 * _hand(item) for item in items])
    seen = _journal(journal)
    assert [line["load"] for line in seen if "load" in line] == [children[0].pid]  # loaded once
    assert [line["call"] for line in seen if "call" in line] == [2, 2, 1, 4, 1]
    # FF: the shared model holds the first entry's config
    assert {line["name"] for line in seen if "name" in line} == {"bright"}
