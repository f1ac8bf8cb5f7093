"""UniRL 0.2.0's own `RemoteRewardBackend` and `RewardService`, unchanged, against `serve
--unirl-secret-file`; run by tests/ops/test_serve_unirl.py in envs/trl.

Run as `python -m tests.helpers.unirl_remote_client ARGS_JSON`. ARGS_JSON: image_url and video_url
(each `http://host:port/unirl/<secret>`), image_identity and video_identity (the servers' identity
hashes), levels (grey levels, one 8x8 image each), weights (UniRL's `reward_weights`), required
(UniRL's `required_rewards`). Nothing of this project is imported: only UniRL's client, as its users
run it, with its identity echo and version pin on. Prints one JSON report line of what UniRL's code
returned (the test computes the expected values by hand).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import requests
import torch
from unirl.reward.remote import RemoteRewardBackend, RemoteRewardSpec
from unirl.reward.service import RewardService
from unirl.types.primitives import Images, Texts, Video, Videos
from unirl.types.reward import RewardRequest
from unirl.types.sample import Part, Sample
from unirl.types.sampling import DiffusionSamplingParams

METHODS = ("weighted_sum", "mean", "min", "max")
REDUCTIONS = ("first", "mean", "max")


def backend(url: str, required: list[str], identity: str, **fields: Any) -> RemoteRewardBackend:
    spec = RemoteRewardSpec(
        base_url=url,
        required_rewards=tuple(required),
        require_identity_echo=True,
        expected_scorer_version=identity,
        max_retries=1,
        **fields,
    )
    return RemoteRewardBackend(config=spec, base_device="cpu")


def images(levels: list[int]) -> Images:
    """Float CHW in [0, 1], as a VAE decode hands them over (UniRL makes PIL images of them)."""
    return Images.from_dense(torch.stack([torch.full((3, 8, 8), v / 255) for v in levels]))


def image_request(levels: list[int]) -> RewardRequest:
    count = len(levels)
    return RewardRequest(
        generated={"image": images(levels)},
        sample_ids=[f"s{i}" for i in range(count)],
        group_ids=["g0", "g0", "g1", "g1"][:count],
        generation_prompt=Texts(texts=["a grey square"] * count),
        metadata=[{"policy_version": 7, "step": i} for i in range(count)],
    )


def response_of(response: Any) -> dict[str, Any]:
    return {
        "rewards": list(response.rewards),
        "components": {k: list(v) for k, v in response.component_rewards.items()},
        "successes": list(response.successes),
        "errors": list(response.errors),
    }


def status_of(call: Any) -> Any:
    """The HTTP status UniRL's client raised with (it does not retry a 4xx), or what it raised."""
    try:
        call()
    except requests.HTTPError as exc:
        return [exc.response.status_code, exc.response.json()]
    except ValueError as exc:
        return str(exc)
    return "no error"


def aggregations(args: dict[str, Any], report: dict[str, Any]) -> None:
    """Every aggregation_method with every sub_metric_reduce, on one image batch each."""
    levels, identity = args["levels"], args["image_identity"]
    for method in METHODS:
        for reduce in REDUCTIONS:
            remote = backend(
                args["image_url"],
                args["required"],
                identity,
                reward_weights=args["weights"],
                aggregation_method=method,
                sub_metric_reduce=reduce,
            )
            available = remote.is_available()  # UniRL checks required_rewards against /health
            scored = response_of(remote.compute_rewards(image_request(levels)))
            report["runs"].append({"method": method, "reduce": reduce, **scored})
            report["available"].append(available)
            remote.dispose()


def service(args: dict[str, Any], report: dict[str, Any]) -> None:
    """UniRL's RewardService over the remote backend: a real Sample scored and its rewards
    attached."""
    levels = args["levels"]
    ids = [f"p{i}" for i in range(len(levels))]
    root = Part.input(ids, primitives={"text": Texts(texts=["a grey square"] * len(levels))})
    shell = root.fork(1, sampling_params=DiffusionSamplingParams())
    sample = Sample(parts=[root, shell.fill(primitives={"image": images(levels)})])
    remote = backend(
        args["image_url"], args["required"], args["image_identity"], reward_weights=args["weights"]
    )
    part = RewardService(remote).score_and_attach(sample).parts[-1]
    report["service"] = part.rewards.tolist()
    remote.dispose()


def refusals(args: dict[str, Any], report: dict[str, Any]) -> None:
    """A reward not served (UniRL's own /health check), a wrong secret, another scorer version."""
    url, identity, request = args["image_url"], args["image_identity"], image_request([0])
    missing = backend(url, ["no_such_reward"], identity)
    report["missing"] = status_of(missing.is_available)
    wrong = backend(url.rsplit("/", 1)[0] + "/" + "x" * 43, args["required"], identity)
    report["wrong_secret_available"] = wrong.is_available()
    report["wrong_secret"] = status_of(lambda: wrong.compute_rewards(request))
    pinned = backend(url, args["required"], "0" * 64)
    report["other_version"] = status_of(lambda: pinned.compute_rewards(request))
    for remote in (missing, wrong, pinned):
        remote.dispose()


def video(args: dict[str, Any], report: dict[str, Any]) -> None:
    """A video request: UniRL encodes each clip as an mp4 (diffusers' export_to_video, fps 8)."""
    clips = [[0.2, 0.4, 0.8], [1.0, 0.0, 0.6]]  # per frame, a solid grey level
    frames = [torch.stack([torch.full((3, 16, 16), v) for v in clip]) for clip in clips]  # TCHW
    request = RewardRequest(
        generated={"video": Videos.from_list([Video(frames=f) for f in frames])},
        sample_ids=["v0", "v1"],
        generation_prompt=Texts(texts=["a clip"] * 2),
    )
    remote = backend(args["video_url"], ["video"], args["video_identity"], input_kind="video")
    report["video_available"] = remote.is_available()
    report["video"] = response_of(remote.compute_rewards(request))
    remote.dispose()


def main() -> None:
    args = json.loads(sys.argv[1])
    report: dict[str, Any] = {
        "health": requests.get(args["image_url"] + "/health", timeout=10).json(),
        "runs": [],
        "available": [],
    }
    for step in (aggregations, service, refusals, video):
        step(args, report)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
