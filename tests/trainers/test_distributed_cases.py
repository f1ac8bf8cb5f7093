"""DistributedRewards' edge cases on 2 torchrun ranks (gloo, CPU) with in-process scorers: one run
of tests/helpers/distributed_cases.py in envs/trl, then one test per case on what each rank saw."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import numpy as np
import pytest

from tests.conftest import REPO_ROOT, env_python, launcher_free_env

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def seen(tmp_path_factory) -> dict[str, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("cases")
    env = launcher_free_env()
    command = [
        str(env_python("trl")),
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
    ]
    done = subprocess.run(
        [*command, str(REPO_ROOT / "tests" / "helpers" / "distributed_cases.py"), str(out)],
        env=env,
        cwd=out,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(out.glob("*-rank0.json")):
        name = path.name.removesuffix("-rank0.json")
        found[name] = [
            json.loads(path.read_text()),
            json.loads((out / f"{name}-rank1.json").read_text()),
        ]
    return found


def ranks(seen, name: str) -> list[dict[str, Any]]:
    both = seen[name]
    for rank in both:
        assert "crashed" not in rank, rank["crashed"]
    return both


@pytest.mark.parametrize(
    "name",
    [
        # the panel checks sizes: a spanning group is scored whole
        "pointwise_panel_with_a_group_size",
        "nested_panel_with_a_groupwise_scorer",  # a groupwise scorer inside a panel inside a panel
        # finish_reason read without being declared; reference {}
        "every_field_travels_and_an_empty_reference_too",
    ],
)
def test_the_world_equals_one_process(seen, name):
    for rank, found in enumerate(ranks(seen, name)):
        assert found["world"] == found["alone"], name
        assert found["mine"]["ids"] == found["alone"]["ids"][6 * rank : 6 * rank + 6]
        assert found["mine"]["rewards"] == found["alone"]["rewards"][6 * rank : 6 * rank + 6]


def test_ff_groupwise_media_models_get_groups_spanning_ranks_whole_through_shared_memory(seen):
    from tests.conftest import wait_until_gone
    from tests.helpers.ff_models import brightness, media_groups, scaled_ranks

    both = ranks(seen, "ff_groupwise_media_models_score_groups_spanning_ranks_whole")
    items = media_groups(12)
    hand = []
    for start in range(0, 12, 4):  # groups g0, g1 (spans the ranks: m4, m5 | m6, m7), g2
        group = items[start : start + 4]
        image = scaled_ranks([brightness(item.image) for item in group])
        video = scaled_ranks([float(np.mean([brightness(f) for f in it.video])) for it in group])
        hand += [i + 0.5 * v for i, v in zip(image, video, strict=True)]
    media = items[0].image.nbytes + items[0].video.nbytes
    for rank, found in enumerate(both):
        assert found["world"]["rewards"] == pytest.approx(hand)
        assert found["world"] == found["alone"]  # one process scoring every whole group
        assert found["mine"]["rewards"] == pytest.approx(hand[6 * rank : 6 * rank + 6])
        assert wait_until_gone(found["pids"], 10.0) == []  # each rank's children
    owner, other = both
    assert owner["calls"] == [4, 4] and other["calls"] == [4]  # whole groups, g1 on rank 0
    # m6 and m7's arrays crossed as raw bytes (as base64 JSON they would take 4/3 of them), and
    # rank 0's children got all 8 items' arrays through the shared segment
    for found in both:
        assert 2 * media < found["exchanged_bytes"] < 2 * media * 4 / 3
    for transport in owner["transport"]:
        shared = transport.get("shared_copied", 0) + transport.get("shared_in_place", 0)
        assert shared >= 8 * media and transport.get("in_band", 0) < media, transport


def test_wfm_one_trajectory_per_rank_scores_as_one_process_would(seen):
    """Each rank decodes and uploads its own trajectory; the group spans ranks; the rewards are
    one process's, by hand; a group of 3 (size 2) fails every rank before any upload."""
    for rank, found in enumerate(ranks(seen, "wfm_one_trajectory_per_rank")):
        assert found["world"] == found["alone"]
        assert found["world"]["ids"] == ["traj0", "traj1"]
        assert found["world"]["rewards"] == [204.0, 102.0]  # the uint8 videos' means
        assert found["mine"]["ids"] == [f"traj{rank}"]
        assert found["mine"]["rewards"] == [[204.0, 102.0][rank]]
        assert found["uploads"] == 1 and found["grad"] == [False] * 3  # under torch.no_grad()
        assert found["bad"]["error"] == "RankFailed", found["bad"]
        assert (
            "GroupsIncomplete: group 'b' has 3 items, expected group_size 2"
            in (found["bad"]["message"])
        )
        assert found["bad_uploads"] == 0


def test_an_optional_terms_failure_covers_whole_groups_never_part_of_one(seen):
    for found in ranks(seen, "an_optional_term_fails_for_whole_groups"):
        world = found["world"]
        (failure,) = world["term_failures"]
        assert failure["term"] == "salted" and "s7" in failure["ids"]
        groups: dict[str, set[bool]] = {}
        for item_id, value in zip(world["ids"], world["component_rewards"]["salted"], strict=True):
            groups.setdefault(f"p{int(item_id[1:]) // 4}", set()).add(value is None)
        # p1 spans ranks: failed whole
        assert all(len(kinds) == 1 for kinds in groups.values()), groups
        assert groups["p1"] == {True}


def test_a_failure_in_a_spanning_group_raises_the_same_error_everywhere_and_the_next_step_runs(
    seen,
):
    both = ranks(seen, "a_failure_inside_a_spanning_group_fails_every_rank")
    assert {found["first"]["error"] for found in both} == {"RankFailed"}
    assert len({found["first"]["message"] for found in both}) == 1
    assert "item 's6' is poison" in both[0]["first"]["message"]
    assert all("value" in found["after"] for found in both)


def test_fail_step_takes_part_and_keeps_the_ranks_in_step(seen):
    both = ranks(seen, "fail_step_keeps_the_ranks_in_step")
    messages = {found["first"]["message"] for found in both}
    assert messages == {
        "reward step failed on rank(s) [1] of 2: rank 1: ValueError: this rank's prompts "
        "could not be read"
    }
    assert [found["after"]["value"] for found in both] == [[0.0, 1.0, 0.0, 0.0, 1.0, 0.0]] * 2


def test_an_empty_shard_takes_part(seen):
    first, second = ranks(seen, "an_empty_shard_takes_part")
    assert second["mine"]["ids"] == [] and first["world"] == second["world"]
    assert first["world"]["ids"] == first["mine"]["ids"] == [f"s{n}" for n in range(6)]


def test_a_rank_that_skipped_a_call_is_caught_not_mixed(seen):
    first, second = ranks(seen, "a_skipped_call_is_caught_not_mixed")
    for call in (first["calls"][0], second["calls"][0]):
        assert (
            call["error"] == "RankLost" and "out of step (rank 0: call 1 step 1" in call["message"]
        ), call
    assert first["calls"][1]["error"] == "RankLost"  # broken for good: never a later call's data


def test_a_stuck_peer_is_lost_within_the_bound(seen):
    waiting, late = ranks(seen, "a_stuck_peer_is_lost_within_the_bound")
    assert waiting["call"]["error"] == "RankLost" and "timeout_s=3" in waiting["call"]["message"]
    assert 2.5 < waiting["call"]["seconds"] < 6.0, waiting  # the bound, not gloo's 30 minutes
    assert late["call"]["error"] == "RankLost"
    assert "value" not in late["call"]


def test_rank_media_rebuilds_arrays_bit_for_bit_and_refuses_a_manifest_past_its_buffer():
    from supervisor.arena import HeapArena
    from supervisor.compose import rank_media
    from supervisor.errors import RewardContractError
    from supervisor.types import RewardItem

    rng = np.random.default_rng(2)
    item = RewardItem(
        id="a",
        image=rng.integers(0, 256, (4, 5, 3), dtype=np.uint8),
        condition_images=[rng.integers(0, 256, (2, 3, 3), dtype=np.uint8)] * 2,
        audio=rng.standard_normal((2, 7)).astype(np.float32),
        audio_sample_rate=8000,
    )
    arrays: list[np.ndarray] = []
    described, end = rank_media.manifest(item, arrays, 0)
    blob = np.frombuffer(rank_media.buffer(arrays), dtype=np.uint8)
    assert end == blob.size
    fields = rank_media.rebuilt(described, blob, HeapArena(), 1)
    assert np.array_equal(fields["image"], item.image)
    assert np.array_equal(fields["audio"], item.audio) and fields["audio"].dtype == np.float32
    assert [a.tolist() for a in fields["condition_images"]] == [
        a.tolist() for a in item.condition_images
    ]
    with pytest.raises(RewardContractError, match="rank 1 shipped media 'audio'"):
        rank_media.rebuilt(described, blob[:-4], HeapArena(), 1)
