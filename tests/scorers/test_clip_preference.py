"""clip_preference with a tiny random-weight CLIP built at test time (tests/helpers/tiny_clip.py),
in envs/embed.

This suite's env has no torch, so the reference figures come from scripts run elsewhere: the
hand computation from CLIPModel's two towers in envs/embed, LocalRewardBackend in envs/trl (a
trainer env with torch and transformers, as in-process scoring needs; envs/embed lacks httpx).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from scorers.builtin.clip_preference import ClipPreference
from scorers.identity import scorer_identity_hash
from supervisor import RewardItem, RewardRequest, ScorerRequestError, ScorerStartupError
from tests.conftest import REPO_ROOT, env_python, launcher_free_env

pytestmark = pytest.mark.slow

SCORER = "clip_preference"
LONG_PROMPT = "a red cat next to a dog, " * 20  # ~140 tokens: past CLIP's 77
PROMPTS = ["a red cat", "a dog", "a red cat", "a dog", LONG_PROMPT]


def _images() -> list[np.ndarray]:
    """RGB, RGBA, grayscale, a 150 KB one (goes through the shared segment), a small one (padded by
    the crop)."""
    rng = np.random.default_rng(7)
    shapes = [(40, 50, 3), (64, 48, 4), (36, 36, 1), (260, 200, 3), (20, 28, 3)]
    return [rng.integers(0, 256, shape, dtype=np.uint8) for shape in shapes]


IMAGES = _images()
REQUEST = RewardRequest(
    items=[
        RewardItem(id=f"item{i}", prompt=prompt, image=image)
        for i, (prompt, image) in enumerate(zip(PROMPTS, IMAGES, strict=True))
    ]
)

# Computes exp(logit_scale) * cos / 26 from CLIPModel itself, one item at a time (no batching, no
# prompt sharing), on the scorer's preprocessing; also checks that preprocessing on uniform images.
HAND_SCRIPT = r"""
import json, sys
import numpy as np, torch
from transformers import AutoTokenizer, CLIPModel
from scorers.builtin.clip_preference import ImageTransform

model_dir, cases = sys.argv[1], np.load(sys.argv[2])
prompts = json.loads(sys.argv[3])
transform = ImageTransform.from_dir(model_dir)
mean, std = torch.tensor(transform.mean).view(3, 1, 1), torch.tensor(transform.std).view(3, 1, 1)
grey = np.full((50, 70, 3), 100, np.uint8)
assert torch.allclose(
    transform(grey, "grey"), ((torch.full((3, 32, 32), 100.0) / 255 - mean) / std), atol=1e-6
)
clear = np.zeros((40, 40, 4), np.uint8)  # fully transparent: white, as transformers composites it
assert torch.allclose(
    transform(clear, "clear"), (1.0 - mean) / std * torch.ones(3, 32, 32), atol=1e-6
)
model = CLIPModel.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32).eval()
tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
scores = []
with torch.inference_mode():
    for index, prompt in enumerate(prompts):
        pixels = transform(cases[f"image{index}"], str(index))[None]
        tokens = tokenizer([prompt], truncation=True, max_length=77, return_tensors="pt")
        image = model.get_image_features(pixel_values=pixels).pooler_output[0]
        text = model.get_text_features(**tokens).pooler_output[0]
        cosine = torch.dot(image, text) / (
            torch.linalg.vector_norm(image) * torch.linalg.vector_norm(text)
        )
        scores.append(float(torch.exp(model.logit_scale) * cosine / 26.0))
print(json.dumps(scores))
"""

LOCAL_SCRIPT = r"""
import json, sys
import numpy as np
from supervisor import LocalRewardBackend, RewardItem, RewardRequest

params, cases, prompts = json.loads(sys.argv[1]), np.load(sys.argv[2]), json.loads(sys.argv[3])
items = [
    RewardItem(id=f"item{i}", prompt=p, image=cases[f"image{i}"]) for i, p in enumerate(prompts)
]
with LocalRewardBackend(sys.argv[4], params=params) as backend:
    response = backend.compute_rewards(RewardRequest(items=items))
    print(
        json.dumps(
            {
                "rewards": response.rewards,
                "identity_hash": backend.identity_hash,
                "diagnostics": response.diagnostics,
            }
        )
    )
"""


# transformers' own pipeline, item by item: its image processor (the PIL one: envs/trl has pillow,
# not torchvision) and CLIPModel.forward's logits_per_image, against the scorer run in process.
PARITY_SCRIPT = r"""
import json, sys
import numpy as np, torch
from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel
from scorers.base import ScoreItem, score_checked
from scorers.builtin.clip_preference import ClipPreference

model_dir, cases, prompts = sys.argv[1], np.load(sys.argv[2]), json.loads(sys.argv[3])
images = [cases[f"image{i}"] for i in range(len(prompts))]
processor = AutoImageProcessor.from_pretrained(model_dir, local_files_only=True)
tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
model = CLIPModel.from_pretrained(model_dir, local_files_only=True).eval()
scorer = ClipPreference(model_dir=model_dir)
scorer.load("cpu")
theirs, pixel_max, pixel_changed = [], [], []
with torch.inference_mode():
    for index, (prompt, image) in enumerate(zip(prompts, images)):
        tokens = tokenizer([prompt], truncation=True, max_length=77, return_tensors="pt")
        pixels = processor(images=[image], return_tensors="pt")["pixel_values"]
        theirs.append(float(model(**tokens, pixel_values=pixels).logits_per_image[0, 0]) / 26.0)
        gap = (scorer._transform(image, str(index)) - pixels[0]).abs()
        pixel_max.append(float(gap.max()))
        pixel_changed.append(float((gap > 1e-5).float().mean()))
items = [ScoreItem(id=str(i), prompt=p, image=im) for i, (p, im) in enumerate(zip(prompts, images))]
ours = score_checked(scorer, items).terms["clip_preference"]
print(
    json.dumps(
        {"theirs": theirs, "ours": ours, "pixel_max": pixel_max, "pixel_changed": pixel_changed}
    )
)
"""


def run_in_env(env: str, args: list[str], cwd: Path) -> str:
    """Run python in envs/ENV with this checkout importable; its last stdout line."""
    done = subprocess.run(
        [str(env_python(env)), *args],
        cwd=cwd,
        env=launcher_free_env(
            PYTHONPATH=str(REPO_ROOT), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"
        ),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny_clip") / "model"
    run_in_env(
        "embed", [str(REPO_ROOT / "tests" / "helpers" / "tiny_clip.py"), str(out)], out.parent
    )
    return out


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("clip_cases") / "cases.npz"
    np.savez(path, **{f"image{i}": image for i, image in enumerate(IMAGES)})
    return path


@pytest.fixture(scope="module")
def embed_python() -> Path:
    return env_python("embed")


@pytest.fixture(scope="module")
def clip_child(embed_python, tiny_model):
    """The tiny model's resident child, batches of 2: the tests below only score with it (a 422
    leaves it serving, which the first one checks)."""
    from tests.helpers.shared_child import shared_child

    params = {"model_dir": str(tiny_model), "batch_size": 2}
    with shared_child(embed_python, SCORER, input_kind="image", params=params) as backend:
        yield backend


def test_managed_scores_are_the_hand_computed_pickscore(clip_child, tiny_model, cases, tmp_path):
    params = {"model_dir": str(tiny_model), "batch_size": 2}
    backend = clip_child
    # the hand computation (envs/embed) and the in-process run (envs/trl, the TRL env has the same
    # torch and transformers, and this project installed) side by side: nothing shared
    pool = ThreadPoolExecutor(2)
    hand_run = pool.submit(
        run_in_env,
        "embed",
        ["-c", HAND_SCRIPT, str(tiny_model), str(cases), json.dumps(PROMPTS)],
        tmp_path,
    )
    local_run = pool.submit(
        run_in_env,
        "trl",
        ["-c", LOCAL_SCRIPT, json.dumps(params), str(cases), json.dumps(PROMPTS), SCORER],
        tmp_path,
    )
    pool.shutdown(wait=False)
    response = backend.compute_rewards(REQUEST)
    rewards = response.rewards
    assert backend.compute_rewards(REQUEST).rewards == rewards  # deterministic
    assert len(set(rewards)) == len(rewards), rewards
    # same image, other prompt; and same prompt, other image: both change the score
    again = RewardRequest(items=[RewardItem(id="a", prompt="a dog", image=IMAGES[0])])
    assert backend.compute_rewards(again).rewards[0] != rewards[0]
    assert rewards[0] != rewards[2]  # "a red cat" on two images
    assert response.diagnostics["clip_preference"]["values"]["truncated"] == 1
    hand = json.loads(hand_run.result())
    assert rewards == pytest.approx(hand, abs=1e-5)
    health = backend.health()
    assert health["packages"]["transformers"].startswith("5.") and health["packages"][
        "torch"
    ].startswith("2.13")
    # an item without its prompt is a 4xx naming it, and the child keeps serving
    with pytest.raises(ScorerRequestError) as info:
        backend.compute_rewards(RewardRequest(items=[RewardItem(id="no-prompt", image=IMAGES[0])]))
    assert (
        info.value.status == 422
        and "'no-prompt'" in str(info.value)
        and "'prompt'" in str(info.value)
    )
    assert backend.compute_rewards(REQUEST).rewards == rewards
    local = json.loads(local_run.result())  # in process
    assert local["rewards"] == rewards
    # one identity, whether computed by the child, in process, or here in the trainer env
    here = scorer_identity_hash(ClipPreference(**params), params)
    assert local["identity_hash"] == backend.identity_hash == here


def test_matches_transformers_own_processor_and_forward(tiny_model, cases, tmp_path):
    """The torch preprocessing is within one pixel level of transformers' PIL processor
    (PickScore's), on under 1% of the values even on noise (resampling's worst case; a float bicubic
    is ~17 levels off)."""
    found = json.loads(
        run_in_env(
            "trl", ["-c", PARITY_SCRIPT, str(tiny_model), str(cases), json.dumps(PROMPTS)], tmp_path
        )
    )
    one_level = 1 / 255 / 0.26130258  # the smallest std of OpenAI CLIP's
    assert max(found["pixel_max"]) <= one_level + 1e-5 and max(found["pixel_changed"]) < 0.01, found
    assert found["ours"] == pytest.approx(found["theirs"], abs=1e-3), found


def test_per_call_round_trip_keeps_scores(managed, embed_python, tiny_model):
    backend = managed(
        embed_python,
        SCORER,
        input_kind="image",
        params={"model_dir": str(tiny_model)},
        gpu_residency="per_call",
    )
    assert backend.health()["residency"] == "offloaded"
    first = backend.compute_rewards(REQUEST).rewards
    assert backend.health()["residency"] == "offloaded"
    on = backend.onload()
    assert on["residency"] == "resident" and on["changed"] is True and on["device"] == "cpu"
    assert on["before"]["rss_bytes"] > 50_000_000 and on["seconds"] >= 0
    off = backend.offload()
    assert (
        off["residency"] == "offloaded" and off["changed"] is True and "rss_bytes" in off["after"]
    )
    print(f"\nclip_preference per_call figures: onload={json.dumps(on)} offload={json.dumps(off)}")
    assert backend.compute_rewards(REQUEST).rewards == first


def test_identity_follows_the_files_not_the_path(tiny_model, tmp_path):
    params = {"model_dir": str(tiny_model)}
    base = scorer_identity_hash(ClipPreference(**params), params)
    moved = tmp_path / "moved"
    shutil.copytree(tiny_model, moved)
    assert (
        scorer_identity_hash(ClipPreference(model_dir=str(moved)), {"model_dir": str(moved)})
        == base
    )
    weights = moved / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a weight byte in the middle: same shapes, other weights
    weights.write_bytes(bytes(data))
    assert (
        scorer_identity_hash(ClipPreference(model_dir=str(moved)), {"model_dir": str(moved)})
        != base
    )
    assert scorer_identity_hash(ClipPreference(**params), {**params, "normalize_by": 1.0}) != base
    # non-semantic
    assert scorer_identity_hash(ClipPreference(**params), {**params, "batch_size": 3}) == base
    missing = {"model_dir": str(tmp_path / "elsewhere")}
    assert ClipPreference(**missing).identity_params(missing)["model"] == {
        "missing": missing["model_dir"]
    }


def test_missing_model_dir_refuses_the_child_naming_the_path(managed, embed_python, tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ScorerStartupError) as info:
        managed(embed_python, SCORER, input_kind="image", params={"model_dir": str(missing)})
    assert str(missing) in str(info.value) and "config.json" in str(info.value), str(info.value)


def test_processor_files_apart_from_the_weights(
    managed, embed_python, tiny_model, clip_child, tmp_path
):
    """PickScore's layout: weights alone, the processor elsewhere; without processor_dir, a clear
    refusal."""
    weights_only = tmp_path / "weights_only"
    weights_only.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_model / name, weights_only / name)
    with pytest.raises(ScorerStartupError) as info:
        managed(embed_python, SCORER, input_kind="image", params={"model_dir": str(weights_only)})
    assert "preprocessor_config.json" in str(info.value) and "set processor_dir" in str(
        info.value
    ), str(info.value)
    split = managed(
        embed_python,
        SCORER,
        input_kind="image",
        params={"model_dir": str(weights_only), "processor_dir": str(tiny_model), "batch_size": 2},
    )
    together = clip_child
    assert split.compute_rewards(REQUEST).rewards == together.compute_rewards(REQUEST).rewards
    assert split.identity_hash == together.identity_hash


@pytest.mark.parametrize(
    "params, match",
    [
        ({"normalize_by": 0}, "normalize_by must be a finite number > 0"),
        ({"normalize_by": -26.0}, "normalize_by must be a finite number > 0"),
        ({"normalize_by": math.inf}, "normalize_by must be a finite number > 0"),
        ({"batch_size": 0}, "batch_size must be a positive int"),
        ({"batch_size": True}, "batch_size must be a positive int"),
        ({"model_dir": ""}, "model_dir must be a non-empty path"),
        ({"model_revision": ""}, "model_revision must be a non-empty string"),
    ],
)
def test_bad_params_are_refused(params, match):
    with pytest.raises(ValueError, match=match):
        ClipPreference(**{"model_dir": "/models/pickscore", **params})


def test_bad_params_refuse_the_child(managed, embed_python, tiny_model):
    with pytest.raises(
        ScorerStartupError, match="clip_preference: normalize_by must be a finite number > 0"
    ):
        managed(
            embed_python,
            SCORER,
            input_kind="image",
            params={"model_dir": str(tiny_model), "normalize_by": 0},
        )
