"""UniRL 0.2.0's own reward code driving the drop-in; run by tests/trainers/test_unirl.py in
envs/trl.

Run as `python -m tests.helpers.unirl_trainer ARGS_JSON` from the repository root (so this
checkout's packages are the ones imported). ARGS_JSON: image_python, math_python, serve_python (one
that runs `serve`), recipe (the seed's managed-backend
recipe, top `_target_` changed), service_root (an existing directory, which UniRL's spec demands),
workdir. Every check builds real UniRL `Sample`s and scores them through UniRL's RewardService /
RewardStack; the expected values are computed here by hand from the uint8 pixels. Prints one JSON
report line.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import hydra.utils
import numpy as np
import psutil
import torch
from omegaconf import OmegaConf
from unirl.reward.base import RewardBackend as UniRLRewardBackend
from unirl.reward.service import RewardService
from unirl.reward.stack import RewardStack
from unirl.types.primitives import Audio, Audios, Images, Texts, Video, Videos
from unirl.types.sample import Part, Sample
from unirl.types.sampling import ARSamplingParams, DiffusionSamplingParams

from supervisor.errors import ScorerRequestError

LEVELS = [0, 51, 102, 255]  # one solid 8x8 RGB image per level
report: dict[str, Any] = {"pids": []}


def solid(level: int, size: int = 8) -> np.ndarray:
    return np.full((size, size, 3), level, np.uint8)


def as_images(arrays: list[np.ndarray]) -> Images:
    """uint8 HWC -> UniRL's float CHW in [0, 1] (what a VAE decode hands over)."""
    return Images.from_dense(
        torch.stack([torch.from_numpy(a).permute(2, 0, 1).float() / 255.0 for a in arrays])
    )


def f32(values: list[float]) -> list[float]:
    """The float32 values UniRL's tensors hold for exact float64 ones."""
    return torch.tensor(values, dtype=torch.float32).tolist()


def image_sample(
    edits: list[np.ndarray], source: np.ndarray | None, metadata: list[dict] | None = None
) -> Sample:
    """One prompt per edit (its root), each with one generated image; the source, when given, is
    every root's input image (UniRL puts it in the request's `conditioning`)."""
    ids = [f"p{i}" for i in range(len(edits))]
    primitives: dict[str, Any] = {
        "text": Texts(texts=[f"make it level {i}" for i in range(len(edits))])
    }
    if source is not None:
        primitives["image"] = as_images([source] * len(edits))
    root = Part.input(ids, primitives=primitives, metadata=metadata)
    shell = root.fork(1, sampling_params=DiffusionSamplingParams())
    return Sample(parts=[root, shell.fill(primitives={"image": as_images(edits)})])


def check(name: str, ok: bool, detail: Any = "") -> None:
    if not ok:
        raise AssertionError(f"{name}: {detail}")
    report.setdefault("passed", []).append(name)


def instantiate(recipe: Path, overrides: dict[str, Any]) -> Any:
    """The seed's recipe with the overrides a user would pass on Hydra's command line."""
    cfg = OmegaConf.load(recipe)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, merge=False)
    backend = hydra.utils.instantiate(cfg.backend)
    report["pids"].extend(leaf.pid for leaf in backend.backend.leaves())
    return backend


def scored(service: RewardService, sample: Sample) -> tuple[list[float], dict[str, list[float]]]:
    part = service.score_and_attach(sample).parts[-1]
    return part.rewards.tolist(), {k: v.tolist() for k, v in (part.component_rewards or {}).items()}


def image_scorer(args: dict[str, Any]) -> None:
    """The seed recipe for an image scorer (UniRL's own spec dataclasses), scored on a real
    Sample."""
    backend = instantiate(Path(args["recipe"]), recipe_overrides(args, "mean_intensity", "image"))
    check("is a UniRL RewardBackend", isinstance(backend, UniRLRewardBackend))
    check("model name", backend.get_model_name() == "mean_intensity" and backend.is_available())
    service = RewardService(backend)
    rewards, components = scored(service, image_sample([solid(v) for v in LEVELS], None))
    expected = f32([v / 255 for v in LEVELS])
    check(
        "mean_intensity by hand",
        rewards == expected and components == {"mean_intensity": expected},
        rewards,
    )
    backend.offload()
    backend.onload()  # resident scorer: both answer, nothing changes
    reward_stack(backend)
    pid = backend.backend.pid
    service.shutdown()  # UniRL's worker teardown: dispose()
    check(
        "dispose ends the child",
        not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie",
    )


class FakeRollout:
    """A rollout sibling as RewardStack needs one: fills each micro's frontier with solid images
    (level from the sample id), on the caller's thread, and never packs groups."""

    def __init__(self) -> None:
        self.threads: set[str] = set()

    def packs_groups(self, sample: Sample) -> bool:
        return False

    def generate(self, micro: Sample) -> Sample:
        self.threads.add(threading.current_thread().name)
        ids = micro.parts[-1].sample_ids
        images = [solid(LEVELS[int(sid.split("/")[0][1:]) % len(LEVELS)]) for sid in ids]
        return micro.with_filled_frontier(primitives={"image": as_images(images)})


def reward_stack(backend: Any) -> None:
    """UniRL's RewardStack, overlap on: micros of 2 scored on its thread while the next generate."""
    count = 7
    root = Part.input(
        [f"p{i}" for i in range(count)], primitives={"text": Texts(texts=["x"] * count)}
    )
    sample = Sample(parts=[root, root.fork(1, sampling_params=DiffusionSamplingParams())])
    rollout = FakeRollout()
    calls: list[str] = []
    original = backend.compute_rewards

    def counted(request: Any) -> Any:  # records who called, then the drop-in's own call
        calls.append(threading.current_thread().name)
        return original(request)

    backend.compute_rewards = counted
    try:
        stack = RewardStack(
            rollout=rollout, reward=RewardService(backend), micro_batch_size=2, overlap=True
        )
        part = stack.rollout_and_score(sample).parts[-1]
    finally:
        del backend.compute_rewards
    expected = f32([LEVELS[i % len(LEVELS)] / 255 for i in range(count)])
    check("stack rewards in row order", part.rewards.tolist() == expected, part.rewards.tolist())
    check("stack components aligned", part.component_rewards["mean_intensity"].tolist() == expected)
    check(
        "stack scored on its thread",
        len(calls) == 4 and all(n.startswith("reward-stack") for n in calls),
        calls,
    )


def recipe_overrides(args: dict[str, Any], name: str, history_kind: str) -> dict[str, Any]:
    return {
        "backend.config.process.python_executable": args["image_python"],
        "backend.config.process.service_root": args["service_root"],
        "backend.config.process.log_dir": args["workdir"],
        "backend.config.scorer.name": name,
        "backend.config.scorer.history_kind": history_kind,
        "backend.config.scorer.params": {"device": "cpu"},
        "backend.config.client.required_rewards": [name],
    }


def image_edit_scorer(args: dict[str, Any]) -> None:
    """The seed recipe as written for editreward, with edit_fidelity: the source reaches the scorer
    from UniRL's `conditioning`; a Sample without one is refused by the scorer (typed)."""
    backend = instantiate(
        Path(args["recipe"]), recipe_overrides(args, "edit_fidelity", "image_edit")
    )
    service = RewardService(backend)
    source = solid(51)
    rewards, components = scored(service, image_sample([solid(v) for v in LEVELS], source))
    expected = f32([1 - abs(v - 51) / 255 for v in LEVELS])
    check(
        "edit_fidelity by hand",
        rewards == expected and components == {"edit_fidelity": expected},
        rewards,
    )
    try:
        service.score_and_attach(image_sample([solid(0)], None))
        check("no source refused", False, "scored without a source image")
    except ScorerRequestError as exc:
        check("no source refused", "needs the source image" in str(exc), exc)
    backend.dispose()


def text_scorer(args: dict[str, Any]) -> None:
    """A mapping `config` (UniRL's spec allows image kinds only) for math_verify in the math env;
    the gold from each root's metadata `reference`."""
    cfg = OmegaConf.create(
        {
            "_target_": "supervisor.adapters.unirl.ManagedScorerProcessBackend",
            "base_device": "cpu",
            "config": {
                "process": {"python_executable": args["math_python"], "log_dir": args["workdir"]},
                "scorer": {"name": "math_verify", "history_kind": "text", "params": {"jobs": 1}},
                "client": {"required_rewards": ["math_verify"], "request_batch_size": 8},
                "transport": "http",
            },
        }
    )
    backend = hydra.utils.instantiate(cfg)
    report["pids"].append(backend.backend.pid)
    rows = [
        ("so \\boxed{10\\%}", "0.1"),
        ("\\boxed{3}", "4"),
        ("the answer is $\\frac{1}{2}$", "0.5"),
    ]
    root = Part.input(
        ["q0", "q1", "q2"],
        primitives={"text": Texts(texts=["what is it?"] * 3)},
        metadata=[{"reference": g} for _, g in rows],
    )
    shell = root.fork(1, sampling_params=ARSamplingParams())
    sample = Sample(
        parts=[root, shell.fill(primitives={"text": Texts(texts=[t for t, _ in rows])})]
    )
    rewards, components = scored(RewardService(backend), sample)
    check("math_verify graded (antlr 4.13.2 in its child)", rewards == [1.0, 0.0, 1.0], rewards)
    check("math components", components == {"math_verify": [1.0, 0.0, 1.0]}, components)
    check("the trainer keeps its own antlr", antlr_version() == "4.9.3")
    backend.dispose()


def antlr_version() -> str:
    from importlib.metadata import version

    return version("antlr4-python3-runtime")


def panel(args: dict[str, Any]) -> None:
    """A panel through RewardPanel: `brightness` (2 x mean_intensity) applies to data_source
    `bright` only, `kept` (edit_fidelity) to all; an item `brightness` does not apply to gets 0.0
    there."""
    image = {
        "backend": "managed",
        "python_executable": args["image_python"],
        "process": {"log_dir": args["workdir"]},
    }
    recipe = Path(args["workdir"]) / "panel.yaml"
    recipe.write_text(
        json.dumps(
            {
                "reward": {
                    "models": {
                        "mean": {**image, "scorer": "mean_intensity", "input_kind": "image"},
                        "edit": {**image, "scorer": "edit_fidelity", "input_kind": "image_edit"},
                    },
                    "reward_functions": {
                        "brightness": {
                            "model": "mean",
                            "weight": 2.0,
                            "applicable_datasets": ["bright"],
                        },
                        "kept": {"model": "edit"},
                    },
                }
            }
        )
    )
    cfg = OmegaConf.create(
        {
            "_target_": "supervisor.adapters.unirl.RewardPanel",
            "base_device": "cpu",
            "recipe": str(recipe),
            "config": {
                "_target_": "unirl.reward.remote.RemoteRewardSpec",
                "base_url": "managed://panel",
                "required_rewards": ["brightness", "kept"],
                "input_kind": "image",
            },
        }
    )
    backend = hydra.utils.instantiate(cfg)
    report["pids"].extend(leaf.pid for leaf in backend.backend.leaves())
    sources = ["bright", "dim", "bright", "dim"]
    sample = image_sample(
        [solid(v) for v in LEVELS], solid(0), [{"data_source": s} for s in sources]
    )
    rewards, components = scored(RewardService(backend), sample)
    brightness = [
        2 * v / 255 if s == "bright" else 0.0 for v, s in zip(LEVELS, sources, strict=True)
    ]
    kept = [1 - v / 255 for v in LEVELS]
    check(
        "panel components",
        components == {"brightness": f32(brightness), "kept": f32(kept)},
        components,
    )
    check(
        "panel rewards",
        rewards == f32([b + k for b, k in zip(brightness, kept, strict=True)]),
        rewards,
    )
    backend.dispose()
    served_panel(args, recipe, sample, rewards)


def served_panel(
    args: dict[str, Any], recipe: Path, sample: Sample, in_process: list[float]
) -> None:
    """The same recipe behind `serve --recipe`, through UniRL's remote recipe with only the top
    `_target_` changed: UniRL's client's rewards (each term's value, weighted_sum at weight 1.0:
    their mean, a term that does not apply left out); components each term's value (0.0 where it
    does not apply, as UniRL's remote backend gives); `required_rewards: [kept]` is that term
    alone."""
    token = "u" * 32
    log = open(Path(args["workdir"]) / "served_panel.log", "w")  # noqa: SIM115 - closed with the server
    server = subprocess.Popen(
        # not a trainer: its own python
        [args["serve_python"], "-m", "supervisor", "serve", "--recipe", str(recipe)],
        stdout=subprocess.PIPE,
        stderr=log,
        env={**os.environ, "MANAGED_SCORERS_TOKEN": token},
        text=True,
    )
    report["pids"].append(server.pid)
    try:
        # its readiness line (the server bounds its own start)
        ready = json.loads(server.stdout.readline())
        url = f"http://127.0.0.1:{ready['port']}"
        report["pids"].extend(
            child.pid for child in psutil.Process(server.pid).children(recursive=True)
        )
        os.environ["PANEL_TOKEN"] = token
        rewards = {}
        for wanted in (["brightness", "kept"], ["kept"]):
            cfg = {
                "_target_": "supervisor.adapters.unirl.RemoteRewardBackend",
                "base_device": "cpu",
                "token_env": "PANEL_TOKEN",
                "config": {
                    "_target_": "unirl.reward.remote.RemoteRewardSpec",
                    "base_url": url,
                    "required_rewards": wanted,
                    "input_kind": "image",
                },
            }
            remote = hydra.utils.instantiate(OmegaConf.create(cfg))
            check(
                f"remote {wanted} is a UniRL RewardBackend", isinstance(remote, UniRLRewardBackend)
            )
            rewards[tuple(wanted)], components = scored(RewardService(remote), sample)
            if wanted == ["brightness", "kept"]:
                raw = [
                    v / 255 if s == "bright" else 0.0
                    for v, s in zip(LEVELS, ["bright", "dim"] * 2, strict=True)
                ]
                expected = {"brightness": f32(raw), "kept": f32([1 - v / 255 for v in LEVELS])}
                check("served panel components", components == expected, components)
            remote.dispose()
        kept = [1 - v / 255 for v in LEVELS]
        unirls = [(raw[i] + kept[i]) / 2 if i % 2 == 0 else kept[i] for i in range(len(LEVELS))]
        check("served panel rewards", rewards[("brightness", "kept")] == f32(unirls), rewards)
        check(
            "served subset rewards",
            rewards[("kept",)] == f32([1 - v / 255 for v in LEVELS]),
            rewards,
        )
    finally:
        server.terminate()
        server.wait(20)
        log.close()


def video_scorer(args: dict[str, Any]) -> None:
    """A video scorer that does not read the prompt: UniRL's RewardService refuses it for training
    (covers_prompt_video() is False) and scores it with require_prompt_video=False."""
    config = {
        "process": {"python_executable": args["image_python"], "log_dir": args["workdir"]},
        "scorer": {
            "name": "video",
            "history_kind": "video",
            "params": {"inner": "mean_intensity", "frames": 2},
        },
    }
    backend = hydra.utils.instantiate(
        {"_target_": "supervisor.adapters.unirl.ManagedScorerProcessBackend", "config": config}
    )
    report["pids"].append(backend.backend.pid)
    check("video does not cover the prompt", backend.covers_prompt_video() is False)
    try:
        RewardService(backend)
        check("RewardService refuses it", False, "accepted")
    except ValueError as exc:
        check("RewardService refuses it", "prompt-to-video" in str(exc), exc)
    # THWC, two frames each
    clips = [np.stack([solid(0), solid(102)]), np.stack([solid(255), solid(51)])]
    frames = [torch.from_numpy(c).permute(0, 3, 1, 2).float() / 255.0 for c in clips]
    root = Part.input(["v0", "v1"], primitives={"text": Texts(texts=["a clip"] * 2)})
    shell = root.fork(1, sampling_params=DiffusionSamplingParams())
    videos = Videos.from_list([Video(frames=f) for f in frames])
    sample = Sample(parts=[root, shell.fill(primitives={"video": videos})])
    rewards, _ = scored(RewardService(backend, require_prompt_video=False), sample)
    check("video by hand", rewards == f32([(0 + 102) / 2 / 255, (255 + 51) / 2 / 255]), rewards)
    backend.dispose()


def audio_scorer(args: dict[str, Any]) -> None:
    """An audio reward on a text-to-audio-video frontier (UniRL's service asks for the video): the
    drop-in reads the generated audio and its rate from the frontier's metadata; loudness by
    hand."""
    config = {
        "process": {"python_executable": args["image_python"], "log_dir": args["workdir"]},
        "scorer": {
            "name": "audio_loudness",
            "history_kind": "audio",
            "params": {"target_dbfs": -20.0},
        },
    }
    backend = hydra.utils.instantiate(
        {"_target_": "supervisor.adapters.unirl.ManagedScorerProcessBackend", "config": config}
    )
    report["pids"].append(backend.backend.pid)
    levels = [0.5, 0.25]  # constant waveforms: 20 log10(level) dBFS
    root = Part.input(["t0", "t1"], primitives={"text": Texts(texts=["a hum"] * 2)})
    shell = root.fork(1, sampling_params=DiffusionSamplingParams())
    clips = Videos.from_list([Video(frames=torch.zeros(2, 3, 8, 8)) for _ in levels])
    sounds = Audios.from_list([Audio(waveform=torch.full((800,), level)) for level in levels])
    filled = shell.fill(
        primitives={"video": clips, "audio": sounds},
        primitive_metadata={"audio": {"sample_rate": 16000}},
    )
    rewards, _ = scored(
        RewardService(backend, require_prompt_video=False), Sample(parts=[root, filled])
    )
    check(
        "audio loudness by hand",
        rewards == f32([-abs(20 * math.log10(v) + 20) for v in levels]),
        rewards,
    )
    backend.dispose()


def main() -> None:
    args = json.loads(sys.argv[1])
    for step in (image_scorer, image_edit_scorer, text_scorer, video_scorer, audio_scorer, panel):
        step(args)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
