"""The example recipe of each seed style (supervisor/ops/example_recipes/, examples/recipes/) runs
end to end: parsed, preflighted, built into panels (one child per distinct model, shared by train
and validation), scored."""

from __future__ import annotations

import os

import psutil
import pytest

from supervisor import (
    ConfigError,
    GroupsIncomplete,
    GroupSizeConflict,
    RewardItem,
    RewardRequest,
    build_panels,
    load_recipe,
    preflight,
)
from supervisor.compose.recipes import instantiate
from tests.conftest import REPO_ROOT

RECIPES = REPO_ROOT / "supervisor" / "ops" / "example_recipes"  # shipped with the package
# names a catalog module of the repo
POSTTRAIN = REPO_ROOT / "examples" / "recipes" / "posttrain_catalog.yaml"
pytestmark = pytest.mark.slow  # managed children in the math and image envs


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)  # recipe paths are relative to where the trainer runs


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children()}


def math_group(group: str, data_source: str, answers: list[str]) -> list[RewardItem]:
    return [
        RewardItem(
            id=f"{group}-{k}",
            group_id=group,
            prompt="What is 2 + 2?",
            text=text,
            reference={"answer": "4"},
            data_source=data_source,
            finish_reason="stop",
        )
        for k, text in enumerate(answers)
    ]


ANSWERS = ["The answer is \\boxed{4}", "\\boxed{5}", "4", "four"]
CORRECT = [1.0, 0.0, 1.0, 0.0]  # math-verify: "four" is not a number it parses


def test_unirl_target_recipe():
    recipe = load_recipe(RECIPES / "unirl_targets.yaml")
    assert recipe.style == "targets" and [t.name for t in recipe.train.terms] == ["correct", "rank"]
    report = preflight(recipe)
    assert report.scorers["correct"]["revision"] == "math-verify-0.9.0"
    before = children()
    train, validation = build_panels(recipe)
    # the math child; the judge is in-process
    assert validation is None and len(children() - before) == 1
    with train:
        response = train.compute_rewards(RewardRequest(items=math_group("g", "gsm8k", ANSWERS)))
    assert response.component_rewards["correct"] == CORRECT
    rank = response.component_rewards["rank"]
    # a win rate over token F1 against the gold "4": "4" wins
    assert rank[2] == 1.0 and rank[2] > rank[0]
    assert response.rewards == pytest.approx(
        [c + 0.5 * r for c, r in zip(CORRECT, rank, strict=True)]
    )
    assert response.identity_hash == train.identity_hash
    assert children() == before


def test_unirl_target_recipe_is_what_hydra_builds():
    omegaconf = pytest.importorskip("omegaconf")
    hydra_utils = pytest.importorskip("hydra.utils")
    tree = omegaconf.OmegaConf.load(RECIPES / "unirl_targets.yaml")
    assert hydra_utils.instantiate(tree.reward) == load_recipe(RECIPES / "unirl_targets.yaml").train
    assert (
        instantiate(omegaconf.OmegaConf.to_container(tree.reward))
        == load_recipe(RECIPES / "unirl_targets.yaml").train
    )


def test_verl_omni_recipe_shares_models_between_terms_and_panels():
    recipe = load_recipe(RECIPES / "verl_omni.yaml")
    assert recipe.style == "verl-omni"
    preflight(recipe)
    before = children()
    train, validation = build_panels(recipe)
    assert validation is not None
    # math and overlap; validation's `correct` reuses the math child
    assert len(children() - before) == 2
    math_backend = next(t.backend for t in train.terms if t.name == "correct")
    assert next(t.backend for t in validation.terms if t.name == "correct") is math_backend
    items = math_group("a", "gsm8k", ANSWERS) + math_group("b", "math", ANSWERS)
    with train, validation:
        response = train.compute_rewards(RewardRequest(items=items))
        val = validation.compute_rewards(RewardRequest(items=items))
    assert val.rewards == CORRECT * 2
    assert response.applicable["rank"] == [True] * 4 + [False] * 4  # rank applies to gsm8k only
    assert response.component_rewards["rank"][4:] == [None] * 4
    overlap = response.component_rewards["overlap"]
    for i, item in enumerate(items):
        weight = 0.2 if item.data_source == "gsm8k" else 0.5
        rank = response.component_rewards["rank"][i]
        expected = CORRECT[i % 4] + weight * overlap[i] + (0.5 * rank if rank is not None else 0.0)
        assert response.rewards[i] == pytest.approx(expected), item.id
    metrics = response.metrics()
    assert (
        metrics["train/reward/rank/sample_count"] == 4
        and metrics["train/reward/correct/sample_count"] == 8
    )
    assert children() == before


def test_posttrain_catalog_recipe():
    recipe = load_recipe(POSTTRAIN)
    assert recipe.style == "catalog"
    report = preflight(recipe)
    assert report.scorers["fits"]["scorer"] == "within_budget"
    before = children()
    train, validation = build_panels(recipe)
    assert validation is not None and len(children() - before) == 2  # one child per provider
    items = [
        RewardItem(id="short", group_id="g", prompt="p", text="four", reference={"answer": "four"}),
        RewardItem(id="long", group_id="g", prompt="p", text="one two three four five six seven "
            "eight nine ten",
                   reference={"answer": "four"}),
    ]  # fmt: skip
    with train, validation:
        response = train.compute_rewards(RewardRequest(items=items))
        val = validation.compute_rewards(RewardRequest(items=items))
    assert response.component_rewards == {"fits": [1.0, 0.0], "length": [1 / 8, 10 / 8]}
    assert response.rewards == pytest.approx([1.0 - 0.1 / 8, -0.1 * 10 / 8])
    assert val.rewards == [1.0, 1.0]
    assert children() == before


def posttrain_recipe(**validation):
    return {
        "catalog": "examples.posttrain_catalog:catalog",
        "group_size": 2,
        "execution": {"kind": "managed", "env": "image", "extra_import_paths": ["."]},
        "reward": {
            "provider": "within_budget",
            "params": {"max_words": 8},
            "weights": {"fits": 1.0, "length": -0.1},
        },
        "validation": {"provider": "answer_match", **validation},
    }


def candidates(group: str, *texts: str) -> list[RewardItem]:
    return [
        RewardItem(id=f"{group}{k}", group_id=group, prompt="p", text=t, reference={"answer": "4"})
        for k, t in enumerate(texts)
    ]


def test_posttrain_group_rules_in_managed_children():
    """The training size holds for a pointwise provider, a request cannot override it, and
    validation has its own size (Posttrain's n_generation): each refusal typed and named."""
    recipe = load_recipe(posttrain_recipe(group_size=3))
    assert (recipe.train.group_size, recipe.validation.group_size) == (2, 3)
    before = children()
    train, validation = build_panels(recipe)
    with train, validation:
        scored = train.compute_rewards(
            RewardRequest(items=candidates("g", "4", "4 5 6 7 8 9 1 2 3"))
        )
        # fits - 0.1 x length: 1 word and 9 words against max_words 8
        assert scored.rewards == pytest.approx([1.0 - 0.1 / 8, 0.0 - 0.1 * 9 / 8])
        with pytest.raises(GroupsIncomplete, match=r"group 'h' has 1 items, expected group_size 2"):
            train.compute_rewards(
                RewardRequest(items=candidates("g", "a", "b") + candidates("h", "c"))
            )
        with pytest.raises(GroupSizeConflict, match="group_size 3, the panel's config 2"):
            train.compute_rewards(RewardRequest(items=candidates("g", "a", "b", "c"), group_size=3))
        val = validation.compute_rewards(RewardRequest(items=candidates("v", "4", "five", "4!")))
        assert val.rewards == [1.0, 0.0, 1.0]
        with pytest.raises(GroupsIncomplete) as info:
            validation.compute_rewards(RewardRequest(items=candidates("v", "4", "4")))
        assert (info.value.group_size, info.value.counts) == (3, {"v": 2})
    assert children() == before


def test_a_selection_key_is_never_dropped():
    with pytest.raises(ConfigError, match=r"validation: unknown key\(s\) \['group_sizes'\]"):
        load_recipe(posttrain_recipe(group_sizes=3))


def test_a_recipe_of_no_known_style_is_refused(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("scorers: [1, 2]\n")
    with pytest.raises(ConfigError, match="unrecognised recipe"):
        load_recipe(path)
    path.write_text("rewards: [1, 2]\n")  # FF's list: its entries are named
    with pytest.raises(
        ConfigError, match=r"rewards\[0\]: a reward is a mapping with a `name` and a `reward_model`"
    ):
        load_recipe(path)


def test_a_verl_function_bound_to_a_missing_model_is_named():
    with pytest.raises(
        ConfigError, match=r"reward.reward_functions.style: model 'judge' is not in reward.models"
    ):
        load_recipe({"reward": {"models": {}, "reward_functions": {"style": {"model": "judge"}}}})


def test_catalog_names_cannot_override_builtins(tmp_path):
    module = tmp_path / "override_catalog.py"
    module.write_text(
        "from scorers.builtin.rules import ExactMatch\n\ndef catalog():\n    return "
        "{'exact_match': ExactMatch}\n"
    )
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        recipe = load_recipe(
            {"catalog": "override_catalog:catalog", "reward": {"provider": "exact_match"}}
        )
        with pytest.raises(
            ConfigError, match="'exact_match' is a built-in scorer and cannot be overridden"
        ):
            preflight(recipe)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("override_catalog", None)
    assert os.getcwd() == str(REPO_ROOT)
