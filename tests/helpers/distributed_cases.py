"""DistributedRewards edge cases, on 2 gloo ranks with in-process scorers (no children): each case
builds its own DistributedRewards and writes what each rank saw to OUT/<case>-rank<R>.json.
Run under torchrun in envs/trl by tests/trainers/test_distributed_cases.py. The last case breaks its
exchange on purpose (a stuck peer); every earlier one must leave the ranks in step."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

# tests.helpers.fixture_scorers, by dotted path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch.distributed as dist  # noqa: E402

from supervisor import (  # noqa: E402
    DistributedRewards,
    LocalRewardBackend,
    PanelTerm,
    RewardItem,
    RewardPanel,
    RewardRequest,
)

OUT = Path(sys.argv[1])
RANK = 0
CASES: dict[str, Callable[[], dict[str, Any]]] = {}


def case(fn: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    CASES[fn.__name__] = fn
    return fn


def items(world: int = 2, per_rank: int = 6, group: int = 4, **fields: Any) -> list[RewardItem]:
    """Groups of `group` in order; rank r holds items [r*per_rank, (r+1)*per_rank): group 1 spans
    ranks."""
    return [
        RewardItem(
            id=f"s{n}",
            group_id=f"p{n // group}",
            prompt=f"q{n // group}",
            text=f"t{n % 3} a",
            reference="t1 a",
            finish_reason="length" if n % 2 else "stop",
            metadata={"n": n},
            **fields,
        )
        for n in range(world * per_rank)
    ]


def shard(everything: list[RewardItem], per_rank: int = 6) -> list[RewardItem]:
    return everything[RANK * per_rank : (RANK + 1) * per_rank]


def outcome(call: Callable[[], Any]) -> dict[str, Any]:
    began = time.monotonic()
    try:
        value = call()
    except Exception as exc:  # noqa: BLE001 - recorded for the test
        return {
            "error": type(exc).__name__,
            "message": str(exc),
            "seconds": time.monotonic() - began,
        }
    return {"value": value, "seconds": time.monotonic() - began}


def dumped(response: Any) -> dict[str, Any]:
    return response.model_dump(exclude={"diagnostics"})


def world_vs_alone(
    backend: Any, everything: list[RewardItem], group_size: int | None
) -> dict[str, Any]:
    scorer = DistributedRewards(backend, timeout_s=30)
    mine, world = scorer.compute_world_rewards(
        RewardRequest(items=shard(everything), group_size=group_size)
    )
    alone = backend.compute_rewards(RewardRequest(items=everything, group_size=group_size))
    return {"mine": dumped(mine), "world": dumped(world), "alone": dumped(alone)}


@case
def pointwise_panel_with_a_group_size():
    """The panel checks group sizes: a group spanning ranks is scored whole, not refused in
    halves."""
    panel = RewardPanel([PanelTerm("match", LocalRewardBackend("exact_match"))], group_size=4)
    return world_vs_alone(panel, items(), None)


@case
def nested_panel_with_a_groupwise_scorer():
    inner = RewardPanel(
        [
            PanelTerm(
                "spy",
                LocalRewardBackend("tests.helpers.fixture_scorers:GroupSpy"),
                component="group_size",
            )
        ]
    )
    outer = RewardPanel(
        [PanelTerm("inner", inner), PanelTerm("f1", LocalRewardBackend("token_f1"))]
    )
    return world_vs_alone(outer, items(), 4)


@case
def every_field_travels_and_an_empty_reference_too():
    """Rebuilt candidates keep what a scorer reads without declaring it (finish_reason,
    metadata)."""
    echo = LocalRewardBackend("tests.helpers.fixture_scorers:EchoFields")
    spy = LocalRewardBackend("tests.helpers.fixture_scorers:GroupSpy")
    panel = RewardPanel(
        [
            PanelTerm("echo", echo, component="truncated"),
            PanelTerm("spy", spy, component="group_size"),
        ]
    )
    everything = [item.model_copy(update={"reference": {}}) for item in items()]
    return world_vs_alone(panel, everything, 4)


@case
def ff_groupwise_media_models_score_groups_spanning_ranks_whole():
    """FF's recipe shape: groupwise image and video models in managed children (env `image`); group
    g1 spans the ranks, its images and videos go to the rank that scores it, as raw bytes, and reach
    its children through the shared segment."""
    from supervisor import build_panels, load_recipe
    from tests.helpers.ff_models import media_groups

    helpers = "tests.helpers.ff_models"
    place = {"env": "image", "extra_import_paths": [str(Path(__file__).resolve().parents[2])]}
    journal = str(OUT / "ff-journal.jsonl")  # one path: params are the same on every rank
    recipe = {
        "rewards": [
            {"name": "image_rank", "reward_model": f"{helpers}:GroupBrightnessRank", **place,
             "journal": journal},
            {"name": "video_rank", "reward_model": f"{helpers}:GroupVideoRank", **place,
             "input_kind": "video", "weight": 0.5},
        ]
    }  # fmt: skip
    everything = media_groups(12)
    train, _ = build_panels(load_recipe(recipe))
    with train:
        scorer = DistributedRewards(train, timeout_s=60)
        mine, world = scorer.compute_world_rewards(RewardRequest(items=shard(everything)))
        lines = [json.loads(line) for line in Path(journal).read_text().splitlines()]
        calls = [line["n"] for line in lines if line["pid"] == train.terms[0].backend.pid]
        shared = [term.backend.transport_bytes() for term in train.terms]
        alone = train.compute_rewards(RewardRequest(items=everything))
        pids = [term.backend.pid for term in train.terms]
    return {
        "mine": dumped(mine),
        "world": dumped(world),
        "alone": dumped(alone),
        "calls": calls,
        "transport": [dict(counts) for counts in shared],
        "exchanged_bytes": scorer.exchanged_bytes,
        "pids": pids,
    }


@case
def wfm_one_trajectory_per_rank():
    """Posttrain's online WFM: each rank owns one trajectory of a group that spans ranks, decodes
    it with the model's decoder and scores it through the job service (media never travel); the
    panel's group size is checked over the world."""
    import tempfile

    import torch

    from supervisor.adapters.decoded_video import DecodedVideoRewards
    from supervisor.backends.jobs import JobRewardBackend
    from tests.helpers.fake_jobs import FakeJobService

    class Decoder(torch.nn.Module):
        output_range = "neg_one_to_one"
        grad_seen: list[bool] = []

        def forward(self, latent: torch.Tensor) -> torch.Tensor:
            self.grad_seen.append(torch.is_grad_enabled())
            return latent * 1.0

    # rank r's trajectory holds values[r] everywhere: 204 and 102 as uint8, its mean its score
    latents = [torch.full((1, 3, 2, 4, 5), v, requires_grad=True) for v in (0.6, -0.2)]
    fast = {"poll_interval_s": 0.02, "poll_backoff_cap_s": 0.1, "request_timeout": 20.0}
    with FakeJobService("t") as service, tempfile.TemporaryDirectory() as spool:
        job = JobRewardBackend(service.url, "t", fps=16.0, spool_dir=spool, **fast)
        with RewardPanel([PanelTerm("video", job)], group_size=2) as panel:
            wfm = DistributedRewards(panel, timeout_s=30)
            adapter = DecodedVideoRewards(wfm, Decoder())
            mine = adapter.compute_rewards([latents[RANK]], [f"traj{RANK}"], ["g"])
            uploads = len(service.uploads)
            world = wfm.world_response
            alone = DecodedVideoRewards(panel, Decoder()).compute_rewards(
                latents, ["traj0", "traj1"], ["g", "g"]
            )
            before = len(service.uploads)
            mine_bad = latents if RANK == 0 else latents[:1]  # a group of 3 over the ranks
            ids = [f"bad{RANK}-{k}" for k in range(len(mine_bad))]
            bad = outcome(lambda: adapter.compute_rewards(mine_bad, ids, ["b"] * len(ids)))
            return {
                "mine": dumped(mine),
                "world": dumped(world),
                "alone": dumped(alone),
                "uploads": uploads,
                "grad": Decoder.grad_seen[:3],
                "bad": bad,
                "bad_uploads": len(service.uploads) - before,
            }


@case
def an_optional_term_fails_for_whole_groups():
    poison = LocalRewardBackend(
        "tests.helpers.fixture_scorers:Salted", {"poison": ["s7"]}
    )  # s7: rank 1, group p1 spans
    panel = RewardPanel(
        [
            PanelTerm("match", LocalRewardBackend("exact_match")),
            PanelTerm("salted", poison, required=False),
        ]
    )
    return world_vs_alone(panel, items(), None)


@case
def a_failure_inside_a_spanning_group_fails_every_rank():
    poison = LocalRewardBackend("tests.helpers.fixture_scorers:Salted", {"poison": ["s6"]})
    scorer = DistributedRewards(
        RewardPanel([PanelTerm("salted", poison)], group_size=4), timeout_s=30
    )
    first = outcome(lambda: scorer.compute_rewards(RewardRequest(items=shard(items()))).rewards)
    clean = [item.model_copy(update={"id": f"c{item.id}"}) for item in shard(items())]
    after = outcome(lambda: scorer.compute_rewards(RewardRequest(items=clean)).rewards)
    return {"first": first, "after": after}


@case
def fail_step_keeps_the_ranks_in_step():
    scorer = DistributedRewards(LocalRewardBackend("exact_match"), timeout_s=30)
    if RANK == 1:
        first = outcome(
            lambda: scorer.fail_step(ValueError("this rank's prompts could not be read"))
        )
    else:
        first = outcome(lambda: scorer.compute_rewards(RewardRequest(items=shard(items()))).rewards)
    after = outcome(lambda: scorer.compute_rewards(RewardRequest(items=shard(items()))).rewards)
    return {"first": first, "after": after}


@case
def an_empty_shard_takes_part():
    scorer = DistributedRewards(LocalRewardBackend("exact_match"), timeout_s=30)
    request = RewardRequest(items=shard(items())) if RANK == 0 else None
    mine, world = scorer.compute_world_rewards(request)
    return {"mine": dumped(mine), "world": dumped(world)}


@case
def a_skipped_call_is_caught_not_mixed():
    scorer = DistributedRewards(LocalRewardBackend("exact_match"), timeout_s=30)
    calls = []
    at = {step: RewardRequest(items=shard(items()), step=step) for step in (1, 2)}
    if RANK == 0:  # rank 1 raised before its step-1 call (a trainer error) and went on to step 2
        calls.append(outcome(lambda: scorer.compute_rewards(at[1]).rewards))
    calls.append(outcome(lambda: scorer.compute_rewards(at[2]).rewards))
    return {"calls": calls}


@case
def a_stuck_peer_is_lost_within_the_bound():
    scorer = DistributedRewards(LocalRewardBackend("exact_match"), timeout_s=3)
    if RANK == 1:
        time.sleep(4.5)  # past the bound: rank 0 must not wait for it
    return {
        "call": outcome(lambda: scorer.compute_rewards(RewardRequest(items=shard(items()))).rewards)
    }


def main() -> int:
    global RANK
    dist.init_process_group("gloo")
    RANK = dist.get_rank()
    for name, fn in CASES.items():
        try:
            result = fn()
        except Exception:  # noqa: BLE001 - the case itself broke: recorded, and the next case still runs
            result = {"crashed": traceback.format_exc()}
        (OUT / f"{name}-rank{RANK}.json").write_text(json.dumps(result))
    sys.stdout.flush()
    # the last case's exchange is broken on purpose: its gloo group may block in a destructor
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
