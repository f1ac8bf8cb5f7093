"""The built-in scorers moved to `scorers.builtin`; the dotted names the registry listed before
still load the same modules, classes and identities (users' recipes, ports, catalogs and pickles
name them)."""

from __future__ import annotations

import importlib
import json
import pickle
import subprocess
import sys

import pytest

from scorers.grading.worker import _resolve
from scorers.identity import scorer_identity_hash
from scorers.registry import BUILTINS, resolve_scorer
from tests.conftest import REPO_ROOT

# what scorers.registry.BUILTINS listed before the move, word for word
OLD_PATHS = {
    "math_verify": "scorers.math_verify:MathVerifyScorer",
    "jpeg_compressibility": "scorers.jpeg:JpegCompressibility",
    "jpeg_incompressibility": "scorers.jpeg:JpegIncompressibility",
    "exact_match": "scorers.rules:ExactMatch",
    "nonempty": "scorers.rules:NonEmpty",
    "constant": "scorers.rules:Constant",
    "mean_intensity": "scorers.rules:MeanIntensity",
    "edit_fidelity": "scorers.image_edit:EditFidelity",
    "token_f1": "scorers.rules:TokenF1",
    "gsm8k": "scorers.task_rules:Gsm8k",
    "countdown": "scorers.task_rules:Countdown",
    "arithmetic": "scorers.task_rules:Arithmetic",
    "format_reward": "scorers.task_rules:FormatReward",
    "pairwise_judge": "scorers.pairwise:PairwiseJudge",
    "llm_judge": "scorers.llm_judge:LlmJudge",
    "text_similarity": "scorers.text_similarity:TextSimilarity",
    "clip_preference": "scorers.clip_preference:ClipPreference",
    "torch_probe": "scorers.torch_probe:TorchProbe",
    "ocr": "scorers.ocr:OcrScorer",
    "video": "scorers.video:VideoScorer",
    "audio_loudness": "scorers.audio:AudioLoudness",
}
PARAMS = {
    "video": {"inner": "scorers.jpeg:JpegCompressibility"},
    "pairwise_judge": {"inner": "scorers.rules:TokenF1"},
    "llm_judge": {"base_url": "http://127.0.0.1:9/v1", "model": "judge"},
    "clip_preference": {"model_dir": "/nonexistent/clip"},
}
MOVED_HELPERS = (
    "scorers.arithmetic",
    "scorers.math_verify_boot",
    "scorers.math_verify_grade",
    "scorers.math_verify_warm",
)
# the identities computed in a fresh interpreter that loads every scorer by the other name
_IDENTITIES = """
import json, sys
from scorers.identity import scorer_identity_hash
from scorers.registry import resolve_scorer

paths, params = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(
    json.dumps(
        {
            n: scorer_identity_hash(resolve_scorer(p)(**params.get(n, {})), params.get(n, {}))
            for n, p in paths.items()
        }
    )
)
"""


def test_the_registry_lists_the_same_names_under_the_new_package():
    added_since = {"code_exec"}  # built-ins born in scorers.builtin have no old name
    assert sorted(set(BUILTINS) - added_since) == sorted(OLD_PATHS)
    for name, old in OLD_PATHS.items():
        assert BUILTINS[name] == old.replace("scorers.", "scorers.builtin.", 1)


@pytest.mark.parametrize("name", sorted(OLD_PATHS))
def test_an_old_dotted_name_gives_the_same_class_and_module(name):
    old_module, new_module = OLD_PATHS[name].partition(":")[0], BUILTINS[name].partition(":")[0]
    assert resolve_scorer(OLD_PATHS[name]) is resolve_scorer(name) is resolve_scorer(BUILTINS[name])
    module = importlib.import_module(old_module)
    assert module is importlib.import_module(new_module) is sys.modules[old_module]
    # the module keeps its own name and spec
    assert module.__name__ == module.__spec__.name == new_module
    assert resolve_scorer(name).__module__ == new_module


@pytest.mark.parametrize("helper", MOVED_HELPERS)
def test_the_moved_helpers_old_names_give_the_same_modules(helper):
    assert importlib.import_module(helper) is importlib.import_module(
        helper.replace("scorers.", "scorers.builtin.", 1)
    )


def test_the_grading_workers_old_grade_function_name_resolves_to_the_same_function():
    pytest.importorskip("math_verify")
    assert _resolve("scorers.math_verify_grade:grade") is _resolve(
        "scorers.builtin.math_verify_grade:grade"
    )


def test_identity_hashes_are_the_same_whichever_dotted_name_loaded_the_scorer():
    """A fresh interpreter loads every scorer by its old name; this one by its new one. The params
    are the same on both sides (a wrapper's inner scorer is a param: its string is part of the
    identity)."""
    fresh = subprocess.run(
        [sys.executable, "-c", _IDENTITIES, json.dumps(OLD_PATHS), json.dumps(PARAMS)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    by_old_names = json.loads(fresh.stdout.strip().splitlines()[-1])
    by_new_names = {
        name: scorer_identity_hash(
            resolve_scorer(BUILTINS[name])(**PARAMS.get(name, {})), PARAMS.get(name, {})
        )
        for name in OLD_PATHS
    }
    assert by_new_names == by_old_names


def test_a_class_loaded_by_its_old_name_pickles_by_its_new_one():
    old = resolve_scorer(OLD_PATHS["exact_match"])
    dumped = pickle.dumps(old)
    assert b"scorers.builtin.rules" in dumped and pickle.loads(dumped) is old
    instance = old()
    assert type(pickle.loads(pickle.dumps(instance))) is old


def test_from_scorers_import_an_old_name_works():
    from scorers import jpeg, rules  # type: ignore[attr-defined]

    assert (
        jpeg is sys.modules["scorers.builtin.jpeg"]
        and rules is sys.modules["scorers.builtin.rules"]
    )


def test_a_managed_child_loads_a_scorer_by_its_old_dotted_name(managed, image_python):
    """The child imports from a root linking only `scorers` and `child_runtime`: the old name
    resolves there too, to the same scorer and identity as its registry name."""
    from supervisor import RewardItem, RewardRequest

    request = RewardRequest(items=[RewardItem(id="a", text="x", reference="x")])
    old, by_name = (
        managed(image_python, OLD_PATHS["exact_match"]),
        managed(image_python, "exact_match"),
    )
    assert old.compute_rewards(request).rewards == by_name.compute_rewards(request).rewards == [1.0]
    assert old.identity_hash == by_name.identity_hash
