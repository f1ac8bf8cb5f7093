"""Items a scorer cannot score (`ScoreResult.failed`): named in a typed error with the others'
rewards as its partial response, never a stand-in reward; an optional panel term keeps the scored
items, a required one raises; chunks and replicas join their failures; the child's answer is
checked."""

from __future__ import annotations

import numpy as np
import pytest

from supervisor import (
    LocalRewardBackend,
    PanelTerm,
    RewardContractError,
    RewardItem,
    RewardPanel,
    RewardRequest,
    ScorerItemsFailed,
)
from supervisor.verify import verify_score_answer
from tests.conftest import REPO_ROOT, env_python

FAILS = "tests.helpers.fixture_scorers:FailsMarked"
TEXTS = ["ok", "fail here", "fine!", "also fail", "good"]
REQUEST = RewardRequest(items=[RewardItem(id=f"s{n}", text=t) for n, t in enumerate(TEXTS)])


def check_failure(error: ScorerItemsFailed) -> None:
    assert set(error.failed) == {"s1", "s3"} and error.kind == "items_failed"
    assert "could not score 2 of 5 items" in str(error) and "'s1': no score for 'fail here'" in str(
        error
    )
    partial = error.partial
    assert partial.ids == ["s0", "s2", "s4"] and partial.rewards == [2.0, 5.0, 4.0]
    assert partial.component_rewards == {"fails_marked": [2.0, 5.0, 4.0]}


@pytest.mark.parametrize("batch", [1, 2, 64])  # failures from several chunks join into one error
def test_in_process_failed_items_raise_with_the_partial_response(batch):
    with LocalRewardBackend(FAILS, request_batch_size=batch) as backend:
        with pytest.raises(ScorerItemsFailed) as info:
            backend.compute_rewards(REQUEST)
    check_failure(info.value)


@pytest.mark.slow
def test_managed_failed_items_travel_by_id_and_the_child_keeps_serving(managed):
    backend = managed(env_python("image"), FAILS, client={"request_batch_size": 2})
    with pytest.raises(ScorerItemsFailed) as info:
        backend.compute_rewards(REQUEST)
    check_failure(info.value)
    assert backend.compute_rewards(
        RewardRequest(items=[RewardItem(id="a", text="abc")])
    ).rewards == [3.0]


def test_a_scorer_naming_a_position_outside_the_batch_breaks_the_contract():
    with LocalRewardBackend(FAILS, params={"bad_position": True}) as backend:
        with pytest.raises(RewardContractError, match="failed must map item positions"):
            backend.compute_rewards(REQUEST)


def test_an_answer_is_checked_nan_only_where_failed_and_failed_ids_must_be_requested():
    values = np.array([1.0, np.nan])
    terms, _, failed, *_ = verify_score_answer(
        {"ids": ["a", "b"], "terms": {"t": values}, "failed": {"b": "why"}}, ["a", "b"], ["t"]
    )
    assert failed == {"b": "why"} and terms["t"][0] == 1.0
    with pytest.raises(RewardContractError, match="non-finite score nan for id 'b'"):
        verify_score_answer({"ids": ["a", "b"], "terms": {"t": values}}, ["a", "b"], ["t"])
    with pytest.raises(
        RewardContractError, match="failed ids \\['zz'\\] that were not in the request"
    ):
        verify_score_answer(
            {"ids": ["a", "b"], "terms": {"t": values}, "failed": {"b": "x", "zz": "y"}},
            ["a", "b"],
            ["t"],
        )
    with pytest.raises(RewardContractError, match="must map ids to reasons"):
        verify_score_answer(
            {"ids": ["a", "b"], "terms": {"t": values}, "failed": {"b": ""}}, ["a", "b"], ["t"]
        )


def test_an_optional_term_keeps_its_scored_items_and_a_required_one_raises():
    def panel(required: bool) -> RewardPanel:
        return RewardPanel(
            [
                PanelTerm(
                    "length", LocalRewardBackend("tests.helpers.fixture_scorers:Probe"), weight=0.5
                ),
                PanelTerm("marked", LocalRewardBackend(FAILS), weight=2.0, required=required),
            ]
        )

    with panel(required=False) as optional:
        got = optional.compute_rewards(REQUEST)
    lengths = [float(len(t)) for t in TEXTS]
    assert got.component_rewards["marked"] == [2.0, None, 5.0, None, 4.0]
    assert got.rewards == [
        0.5 * n + (2.0 * n if i in (0, 2, 4) else 0.0) for i, n in enumerate(lengths)
    ]
    (failure,) = got.term_failures
    assert (
        failure.term == "marked"
        and failure.ids == ["s1", "s3"]
        and failure.kind == "ScorerItemsFailed"
    )
    with panel(required=True) as strict:
        with pytest.raises(ScorerItemsFailed) as info:
            strict.compute_rewards(REQUEST)
    # the term's rewards are not the panel's: nothing above may take them
    assert info.value.partial is None
    assert "'s1'" in str(info.value)


def test_a_panel_inside_a_panel_never_passes_its_term_s_partial_upward():
    inner = RewardPanel([PanelTerm("marked", LocalRewardBackend(FAILS), weight=3.0)])
    with RewardPanel(
        [
            PanelTerm("inner", inner, required=False),
            PanelTerm("probe", LocalRewardBackend("tests.helpers.fixture_scorers:Probe")),
        ]
    ) as outer:
        got = outer.compute_rewards(REQUEST)
    # the inner panel failed whole: its required term failed
    assert got.component_rewards["inner"] == [None] * 5
    assert got.term_failures[0].ids == [f"s{n}" for n in range(5)]


@pytest.mark.slow
def test_replicas_join_their_failures_and_scored_rows(tmp_path):
    from supervisor import ManagedScorerProcessSpec, ReplicatedBackend

    spec = ManagedScorerProcessSpec(
        process={
            "python_executable": str(env_python("image")),
            "extra_import_paths": [str(REPO_ROOT)],
        },
        scorer={"name": FAILS},
        replicas={"count": 2},
    )
    with ReplicatedBackend(spec) as backend:
        with pytest.raises(ScorerItemsFailed) as info:
            backend.compute_rewards(REQUEST)
        check_failure(info.value)
        only_failures = RewardRequest(items=[RewardItem(id=f"f{n}", text="fail") for n in range(4)])
        with pytest.raises(ScorerItemsFailed) as info:
            backend.compute_rewards(only_failures)
    assert info.value.partial.ids == [] and set(info.value.failed) == {"f0", "f1", "f2", "f3"}


def test_score_dataset_writes_failed_rows_with_their_error_and_scores_the_rest(tmp_path):
    import json
    import os
    import subprocess
    import sys

    (tmp_path / "in.jsonl").write_text(
        "".join(json.dumps({"id": f"t{i}", "response": t}) + "\n" for i, t in enumerate(TEXTS))
    )
    recipe = {
        "reward": {
            "models": {"m": {"backend": "local", "scorer": FAILS}},
            "reward_functions": {"len": {"model": "m"}},
        }
    }
    (tmp_path / "r.json").write_text(json.dumps(recipe))
    command = [sys.executable, "-m", "supervisor", "score", "--recipe", str(tmp_path / "r.json")]
    command += ["--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl")]
    done = subprocess.run(
        command,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr  # rows with errors: not a clean run
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [f"t{i}" for i in range(5)]
    assert [r["reward"] for r in rows] == [2.0, None, 5.0, None, 4.0]
    assert (
        "ScorerItemsFailed: no score for 'fail here'" in rows[1]["error"]
        and rows[0]["error"] is None
    )
    # grouped rows: a failed row takes its group down (its siblings' group-relative rewards would be
    # wrong)
    grouped = [
        {"id": f"g{i}", "response": t, "group": f"q{i // 2}"}
        for i, t in enumerate(["ok", "fail", "aa", "bbb"])
    ]
    (tmp_path / "g.jsonl").write_text("".join(json.dumps(row) + "\n" for row in grouped))
    command = [
        *command[:6],
        "--input",
        str(tmp_path / "g.jsonl"),
        "--output",
        str(tmp_path / "g-out.jsonl"),
    ]
    command += ["--group-column", "group"]
    done = subprocess.run(
        command,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "g-out.jsonl").read_text().splitlines()]
    assert [r["reward"] for r in rows] == [None, None, 2.0, 3.0]
    assert "a member of its group could not be scored" in rows[0]["error"]
