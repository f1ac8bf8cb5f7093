"""UniRL 0.2.0's own code driving `supervisor.adapters.unirl.ManagedLocalScorer`; run by
tests/trainers/test_unirl_local.py in envs/trl (the trainer).

Run as `python -m tests.helpers.unirl_local ARGS_JSON` from the repository root. ARGS_JSON:
child_python (an env with UniRL and the child runtime), workdir, judge_url and judge_model (a tiny
model served by `transformers serve`, started by the test). Each scorer is built by Hydra from
its UniRL recipe with the top `_target_` changed, scored through UniRL's RewardService on real
Samples, and compared with UniRL's own class built the way UniRL builds it and called in this
process on the same Sample. Prints one JSON report line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import hydra.utils
import numpy as np
import psutil
from omegaconf import OmegaConf
from unirl.reward.base import RewardBackend as UniRLRewardBackend
from unirl.reward.service import RewardService
from unirl.types.primitives import Texts
from unirl.types.reward import RewardRequest
from unirl.types.sample import Part, Sample
from unirl.types.sampling import ARSamplingParams, DiffusionSamplingParams

from supervisor.errors import ConfigError, ScorerError, ScorerItemsFailed
from tests.helpers.unirl_trainer import as_images, scored

REPO = Path(__file__).resolve().parents[2]
report: dict[str, Any] = {"pids": [], "passed": []}
ANSWERS = [  # (completion, gold): tag, phrase, bare letter, digit gold, wrong, no letter
    ("<answer>B</answer>", "B"),
    ("the answer is C", "C"),
    ("B", "2"),
    ("I pick A", "D"),
    ("no idea", "A"),
]


def check(name: str, ok: bool, detail: Any = "") -> None:
    if not ok:
        raise AssertionError(f"{name}: {detail}")
    report["passed"].append(name)


def managed(args: dict[str, Any], **recipe: Any) -> Any:
    """UniRL's local-scorer recipe with the top `_target_` changed, built by Hydra."""
    cfg = OmegaConf.create(
        {
            "_target_": "supervisor.adapters.unirl.ManagedLocalScorer",
            "python_executable": args["child_python"],
            "base_device": "cpu",
            **recipe,
        }
    )
    backend = hydra.utils.instantiate(cfg)
    report["pids"].append(backend.backend.pid)
    return backend


def mc_exact_match(args: dict[str, Any]) -> None:
    """UniRL's rule-based `mc_exact_match` (graded format), the gold in each root's metadata."""
    spec = {
        "_target_": "unirl.reward.local.mc_exact_match.MCExactMatchSpec",
        "graded_format_reward": True,
    }
    backend = managed(args, config=spec)
    check("mc is a UniRL RewardBackend", isinstance(backend, UniRLRewardBackend))
    check(
        "mc name and kind",
        (backend.get_model_name(), backend.preferred_input_kind) == ("mc_exact_match", "text"),
    )
    ids = [f"q{i}" for i in range(len(ANSWERS))]
    root = Part.input(
        ids,
        primitives={"text": Texts(texts=["Which one? A, B, C or D"] * len(ids))},
        metadata=[{"answer": gold} for _, gold in ANSWERS],
    )
    shell = root.fork(1, sampling_params=ARSamplingParams())
    sample = Sample(parts=[root, shell.fill(primitives={"text": Texts([t for t, _ in ANSWERS])})])
    rewards, components = scored(RewardService(backend), sample)
    from unirl.reward.local.mc_exact_match import MCExactMatchRewardScorer, MCExactMatchSpec

    own = MCExactMatchRewardScorer(
        config=MCExactMatchSpec(graded_format_reward=True), base_device="cpu"
    )
    expected, _ = scored(RewardService(own), sample)
    check("mc rewards equal UniRL's in-process", rewards == expected, (rewards, expected))
    check("mc rewards graded", sorted(set(rewards)) == [0.0, 0.5, 1.0], rewards)
    check("mc components", components == {"mc_exact_match": rewards}, components)
    check("torchvision never imported", "torchvision" not in sys.modules)
    backend.dispose()


def text_sample(questions: list[str], answers: list[str], predictions: list[str]) -> Sample:
    """A text rollout: the question as the root's prompt, the gold in its metadata."""
    ids = [f"q{i}" for i in range(len(questions))]
    root = Part.input(
        ids,
        primitives={"text": Texts(texts=questions)},
        metadata=[{"answer": gold} for gold in answers],
    )
    shell = root.fork(1, sampling_params=ARSamplingParams())
    return Sample(parts=[root, shell.fill(primitives={"text": Texts(predictions)})])


def llm_judge(args: dict[str, Any]) -> None:
    """UniRL's own model-backed `LLMJudgeRewardScorer`, its judge a tiny random model (built
    offline) behind a real engine: the verdicts the child's instance gets from it equal those of
    UniRL's class called here, and both verdicts occur."""
    fields = {
        "endpoint": args["judge_url"],
        "model": args["judge_model"],
        "max_tokens": 8,
        "max_retries": 1,
        # in the judge's own words (its tokenizer knows a few): its greedy reply says "yes" to some
        "prompt_template": "rate {answer} {prediction}",
    }
    spec = {"_target_": "unirl.reward.local.llm_judge.LLMJudgeSpec", **fields}
    scorer = "unirl.reward.local.llm_judge.LLMJudgeRewardScorer"
    backend = managed(args, scorer=scorer, config=spec)
    check(
        "judge name and kind",
        (backend.get_model_name(), backend.input_kind) == ("llm_judge", "text"),
    )
    count = 12
    sample = text_sample(
        [f"rate the image {i} is a good score" for i in range(count)],
        [str(i % 10) for i in range(count)],
        [f"{i} yes" if i % 3 else "no" for i in range(count)],
    )
    rewards, _ = scored(RewardService(backend), sample)
    from unirl.reward.local.llm_judge import LLMJudgeRewardScorer, LLMJudgeSpec

    own = LLMJudgeRewardScorer(config=LLMJudgeSpec(**fields), base_device="cpu")
    expected, _ = scored(RewardService(own), sample)
    check("judge rewards equal UniRL's in-process", rewards == expected, (rewards, expected))
    check("judge verdicts vary", sorted(set(rewards)) == [0.0, 1.0], rewards)
    backend.dispose()


def image_sample(prompts: list[str]) -> Sample:
    rng = np.random.default_rng(7)
    images = [rng.integers(0, 256, (8, 8, 3), dtype=np.uint8) for _ in prompts]
    root = Part.input([f"p{i}" for i in range(len(prompts))], primitives={"text": Texts(prompts)})
    shell = root.fork(1, sampling_params=DiffusionSamplingParams())
    return Sample(parts=[root, shell.fill(primitives={"image": as_images(images)})])


def user_model_scorer(args: dict[str, Any]) -> None:
    """A user's model-backed subclass of UniRL's LocalRewardBackend, its module handed to the child
    by `extra_import_paths`; onload/offload are UniRL's own."""
    from tests.helpers.unirl_user_scorer import TinyAlignScorer, TinyAlignSpec, build

    checkpoint = str(Path(args["workdir"]) / "tiny_align.pt")
    build(checkpoint)
    log = Path(args["workdir"]) / "residency.log"
    spec = {
        "_target_": "tests.helpers.unirl_user_scorer.TinyAlignSpec",
        "model_path": checkpoint,
        "residency_log": str(log),
    }
    backend = managed(
        args,
        scorer="tests.helpers.unirl_user_scorer.TinyAlignScorer",
        extra_import_paths=[str(REPO)],
        config=spec,
    )
    check("model name", backend.get_model_name() == "tiny_align" and backend.is_available())
    sample = image_sample(["a red cat", "two dogs", "blue sky at night", "a red cat"])
    rewards, _ = scored(RewardService(backend), sample)
    own = TinyAlignScorer(config=TinyAlignSpec(model_path=checkpoint), base_device="cpu")
    expected, _ = scored(RewardService(own), sample)
    check("model rewards equal UniRL's in-process", rewards == expected, (rewards, expected))
    check("model rewards vary", len(set(rewards)) >= 3, rewards)
    booted = log.read_text().split() if log.exists() else []
    backend.offload()
    backend.onload()
    moves = log.read_text().split()[len(booted) :]
    check("offload and onload reach UniRL's", moves == ["offload", "onload"], (booted, moves))
    again, _ = scored(RewardService(backend), sample)
    check("after offload and onload", again == expected, again)
    failed(backend)
    backend.dispose()


def failed(backend: Any) -> None:
    """A NaN from the model is that item's failure, raised naming it (as every failure of the
    drop-in: UniRL's service fails the step on an unsuccessful item either way), never a 0."""
    pixels = as_images([np.zeros((8, 8, 3), np.uint8)] * 2)
    request = RewardRequest(
        generated={"image": pixels},
        generation_prompt=Texts(["a red cat", "nan"]),
        sample_ids=["ok", "broken"],
    )
    try:
        backend.compute_rewards(request)
    except ScorerItemsFailed as exc:
        check("nan is an item failure", "'broken'" in str(exc) and "'ok'" not in str(exc), exc)
        check("the failure says why", "tiny_align" in str(exc) and "nan" in str(exc), exc)
        return
    check("nan is an item failure", False, "no error")


def bad_targets(args: dict[str, Any]) -> None:
    """A `_target_` that is not there: refused here (no child), or at the child's boot when the
    input kind is given (nothing imported here)."""
    from supervisor.adapters.unirl import ManagedLocalScorer

    target = "unirl.reward.local.no_such.NoSuchScorer"
    python = args["child_python"]
    here = raised(lambda: ManagedLocalScorer(config={}, scorer=target, python_executable=python))
    check("refused before a child", isinstance(here, ConfigError) and target in str(here), here)
    boot = raised(
        lambda: ManagedLocalScorer(
            config={}, scorer=target, input_kind="text", python_executable=python
        )
    )
    check("refused at boot", isinstance(boot, ScorerError) and target in str(boot), repr(boot))
    report["boot_error"] = type(boot).__name__


def raised(call: Any) -> BaseException | None:
    try:
        backend = call()
    except Exception as exc:  # noqa: BLE001 - the test checks its type
        return exc
    backend.dispose()
    return None


def main() -> None:
    args = json.loads(sys.argv[1])
    for step in (mc_exact_match, llm_judge, user_model_scorer, bad_targets):
        step(args)
    report["children_left"] = [p.pid for p in psutil.Process().children(recursive=True)]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
