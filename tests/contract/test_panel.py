"""Multi-reward panels (issue 10): named terms on any backend, weighted per dataset, required or
optional, applicable to some datasets only, scored concurrently, sharing one backend per
configuration (training and validation panels included), with mergeable diagnostics."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
import pytest
from pydantic import ValidationError

from scorers.base import ScoreItem, Scorer, ScoreResult, ScorerSpec
from scorers.diagnostics import merge_term_reports, to_metrics
from supervisor import (
    BackendPool,
    ConfigError,
    LocalRewardBackend,
    PanelConfig,
    PanelTerm,
    Recipe,
    RemoteRewardBackend,
    RewardBackend,
    RewardContractError,
    RewardItem,
    RewardPanel,
    RewardRequest,
    RewardResponse,
    ScorerCrashLoop,
    ScorerItemsFailed,
    ScorerRequestError,
    ScorerStartupError,
    ScorerTimeout,
    TermFailure,
    build_panel,
    build_panels,
)
from tests.conftest import REPO_ROOT, alive, wait_until_gone
from tests.helpers.fixture_scorers import journal_calls, salted_value

SALTED = "tests.helpers.fixture_scorers:Salted"
PROBE = "tests.helpers.fixture_scorers:Probe"


def item(item_id: str, text: str | None = None, **fields) -> RewardItem:
    return RewardItem(id=item_id, text=item_id if text is None else text, **fields)


def salted(salt: int, poison: Sequence[str] = (), **kwargs) -> LocalRewardBackend:
    return LocalRewardBackend(SALTED, {"salt": salt, "poison": list(poison)}, **kwargs)


def probe(journal: Path, **kwargs) -> LocalRewardBackend:
    return LocalRewardBackend(PROBE, {"journal": str(journal)}, **kwargs)


def journal_ids(path: Path) -> list[list[str]]:
    return [ids for _, ids in journal_calls(str(path))] if path.exists() else []


def kill_and_wait(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    assert wait_until_gone([pid], 5) == []


def managed_config(python: Path, scorer: str, params: dict | None = None, **client) -> dict:
    return {
        "kind": "managed",
        "process": {
            "python_executable": str(python),
            "startup_timeout": 60,
            "request_timeout": 60,
            "extra_import_paths": [str(REPO_ROOT)],
        },
        "scorer": {"name": scorer, "params": params or {}},
        "client": client,
    }


def my_children() -> set[int]:
    return {child.pid for child in psutil.Process().children()}


# -- the weighted sum over applicable terms --------------------------------------------------------
def test_final_is_the_weighted_sum_of_the_terms_that_apply(tmp_path):
    journal = tmp_path / "len"
    items = [
        item("q0", "the capital is paris", reference="Paris", data_source="qa", group_id="q"),
        item("q1", "london", reference="Paris", data_source="qa", group_id="q"),
        item("c0", "hello there", data_source="chat"),
        item("m0", "x", data_source="math"),
    ]
    with RewardPanel(
        [
            PanelTerm("length", probe(journal), weight=0.5),
            PanelTerm("f1", LocalRewardBackend("token_f1"), weight=2.0, applicable_datasets=["qa"]),
            PanelTerm(
                "salt", salted(3), weight=-1.0, applicable_datasets=["math", "chat"], required=False
            ),
        ]
    ) as panel:
        response = panel.compute_rewards(RewardRequest(items=items))
    f1 = 2 * (1 / 4) * 1 / (1 / 4 + 1)  # "the capital is paris" vs "paris": precision 1/4, recall 1
    c0, m0 = salted_value(3, "c0"), salted_value(3, "m0")
    assert response.component_rewards == {
        "length": [20.0, 6.0, 11.0, 1.0],
        "f1": [pytest.approx(f1), 0.0, None, None],
        "salt": [None, None, c0, m0],
    }
    assert response.applicable == {
        "length": [True, True, True, True],
        "f1": [True, True, False, False],
        "salt": [False, False, True, True],
    }
    assert response.rewards == pytest.approx([10.0 + 2 * f1, 3.0, 5.5 - c0, 0.5 - m0])
    assert response.term_failures == [] and response.successes == [True] * 4
    assert journal_ids(journal) == [["q0", "q1", "c0", "m0"]]


def test_a_panel_mixes_managed_remote_and_local_terms(managed, trainer_python, tmp_path):
    """A managed child, a remote server and an in-process scorer in one panel; the managed term
    applies to two datasets only, and its child never sees the other items."""
    journal = tmp_path / "probe"
    child = managed(
        trainer_python, PROBE, params={"journal": str(journal)}, client={"request_batch_size": 2}
    )
    server = managed(trainer_python, SALTED, params={"salt": 7})
    remote = RemoteRewardBackend(
        f"http://127.0.0.1:{server._child.port}", token=server._child.token
    )
    items = [
        item("q0", "paris", reference="Paris", data_source="qa", group_id="q"),
        item("m0", "1", data_source="math"),
        item("q1", "rome", reference="Paris", data_source="qa", group_id="q"),
        item("c0", "hi", data_source="chat"),
    ]
    panel = RewardPanel(
        [
            PanelTerm("length", child, weight=0.5, applicable_datasets=["qa", "chat"]),
            PanelTerm(
                "f1", LocalRewardBackend("token_f1"), weight={"qa": 2.0}, applicable_datasets=["qa"]
            ),
            PanelTerm("salt", remote, weight={"math": 1.0, "*": 0.25}, required=False),
        ]
    )
    try:
        response = panel.compute_rewards(RewardRequest(items=items))
    finally:
        panel.close()
    s = {i.id: salted_value(7, i.id) for i in items}
    assert response.component_rewards == {
        "length": [5.0, None, 4.0, 2.0],
        "f1": [1.0, None, 0.0, None],
        "salt": [s["q0"], s["m0"], s["q1"], s["c0"]],
    }
    assert response.rewards == [
        2.5 + 2.0 + 0.25 * s["q0"],
        s["m0"],
        2.0 + 0.25 * s["q1"],
        1.0 + 0.25 * s["c0"],
    ]
    calls = journal_calls(str(journal))
    assert [ids for _, ids in calls] == [["q0", "q1"], ["c0"]]  # the group whole, m0 never sent
    assert {pid for pid, _ in calls} == {child.pid}
    assert set(response.diagnostics) == {"length", "f1", "salt"}
    assert response.diagnostics["length"] == {"sample_count": 3, "values": {"calls": 2}}
    # closing the panel stopped the child it owned, and left the remote server (not ours) serving
    assert wait_until_gone([child.pid], 5) == []
    assert server.health()["state"] == "ready"


# -- applicability ---------------------------------------------------------------------------------
def test_items_a_term_does_not_apply_to_are_never_sent_to_it(tmp_path):
    math_journal, all_journal = tmp_path / "math", tmp_path / "all"
    items = [
        item(f"{tag}{n}", data_source=tag) for n in range(3) for tag in ("math", "code", "chat")
    ]
    with RewardPanel(
        [
            PanelTerm(
                "math_len", probe(math_journal, request_batch_size=2), applicable_datasets=["math"]
            ),
            PanelTerm("len", probe(all_journal, request_batch_size=4), weight=0.0),
        ]
    ) as panel:
        response = panel.compute_rewards(RewardRequest(items=items))
    assert journal_ids(math_journal) == [["math0", "math1"], ["math2"]]
    assert journal_ids(all_journal) == [
        [i.id for i in items[:4]],
        [i.id for i in items[4:8]],
        [items[8].id],
    ]
    mask = [i.data_source == "math" for i in items]
    assert response.applicable["math_len"] == mask
    # never a fake 0 or NaN
    assert response.component_rewards["math_len"] == [5.0 if m else None for m in mask]
    assert response.rewards == [5.0 if m else 0.0 for m in mask]
    assert response.diagnostics["math_len"]["sample_count"] == 3


def test_an_item_no_term_applies_to_is_refused_before_scoring(tmp_path):
    journal = tmp_path / "calls"
    with RewardPanel(
        [
            PanelTerm("math", probe(journal), applicable_datasets=["math"]),
            PanelTerm("code", salted(1), applicable_datasets=["code"], required=False),
        ]
    ) as panel:
        request = RewardRequest(
            items=[item("m0", data_source="math"), item("x0", data_source="chat"), item("y0")]
        )
        with pytest.raises(
            ScorerRequestError, match="no term of the panel applies to item 'x0'"
        ) as info:
            panel.compute_rewards(request)
        assert info.value.kind == "bad_input"
        assert not journal.exists()  # refused before any term was scored
        # no data_source: matches no list
        with pytest.raises(ScorerRequestError, match="item 'y0'"):
            panel.compute_rewards(RewardRequest(items=[item("y0")]))


def test_terms_on_one_backend_share_its_call_and_each_takes_its_own_items(tmp_path):
    journal = tmp_path / "calls"
    backend = probe(journal)
    items = [
        item("m0", "a", data_source="math"),
        item("c0", "bb", data_source="code"),
        item("h0", "ccc"),
    ]
    with RewardPanel(
        [
            PanelTerm("math_len", backend, weight=2.0, applicable_datasets=["math"]),
            PanelTerm(
                "code_len", backend, weight=-1.0, applicable_datasets=["code"], required=False
            ),
        ]
    ) as panel:
        assert panel.backends == [backend]
        response = panel.compute_rewards(RewardRequest(items=items[:2]))
        assert journal_ids(journal) == [["m0", "c0"]]  # one call for both terms, h0 is nobody's
        assert response.component_rewards == {"math_len": [1.0, None], "code_len": [None, 2.0]}
        assert response.rewards == [2.0, -2.0]
        assert response.diagnostics == {
            "math_len": {"sample_count": 2, "values": {"calls": 1}},
            "code_len": {"sample_count": 2, "values": {"calls": 1}},
        }
        with pytest.raises(ScorerRequestError, match="'h0'"):
            panel.compute_rewards(RewardRequest(items=items))


# -- weights ---------------------------------------------------------------------------------------
def test_per_dataset_weights_fall_back_to_star():
    items = [item("m0", data_source="math"), item("c0", data_source="code"), item("n0")]
    with RewardPanel([PanelTerm("salt", salted(5), weight={"math": 2.0, "*": 0.5})]) as panel:
        response = panel.compute_rewards(RewardRequest(items=items))
    values = [salted_value(5, i.id) for i in items]
    assert response.component_rewards["salt"] == values
    assert response.rewards == [2.0 * values[0], 0.5 * values[1], 0.5 * values[2]]


def test_a_missing_dataset_weight_is_refused_before_scoring(tmp_path):
    journal = tmp_path / "calls"
    length, salt = probe(journal), salted(5)
    request = RewardRequest(items=[item("m0", data_source="math"), item("c0", data_source="code")])
    everywhere = RewardPanel(
        [PanelTerm("len", length), PanelTerm("salt", salt, weight={"math": 2.0})],
        owns_backends=False,
    )
    with pytest.raises(
        ScorerRequestError, match=r"term 'salt' has no weight for item 'c0' \(data_source 'code'\)"
    ):
        everywhere.compute_rewards(request)
    assert not journal.exists()  # refused before any term was scored
    # a term that does not apply to an item needs no weight for it
    math_only = PanelTerm("salt", salt, weight={"math": 2.0}, applicable_datasets=["math"])
    with RewardPanel([PanelTerm("len", length), math_only]) as panel:
        response = panel.compute_rewards(request)
    assert response.component_rewards["salt"] == [salted_value(5, "m0"), None]
    assert response.rewards == [2.0 + 2.0 * salted_value(5, "m0"), 2.0]


@pytest.mark.parametrize("weight", [float("nan"), float("inf"), True, "1", {"math": float("nan")}])
def test_a_weight_that_is_not_a_finite_number_fails_at_construction(weight):
    with pytest.raises(ConfigError, match="is not a finite number"):
        RewardPanel([PanelTerm("salt", salted(1), weight=weight)])


# -- failures --------------------------------------------------------------------------------------
def test_a_required_term_failure_raises_its_typed_error():
    items = [item("a0", data_source="math"), item("b0", data_source="code")]
    with RewardPanel(
        [
            PanelTerm("ok", salted(1), required=False),
            PanelTerm("strict", salted(2, poison=["b0"]), required=True),
        ]
    ) as panel:
        with pytest.raises(ScorerRequestError, match="'b0' is poison") as info:
            panel.compute_rewards(RewardRequest(items=items))
    assert info.value.kind == "bad_input"
    assert info.value.__notes__ == ["panel term(s) strict: required"]


def test_an_optional_term_failure_is_recorded_with_exactly_its_ids_and_adds_nothing():
    items = [
        item("m0", data_source="math", group_id="g"),
        item("m1", data_source="math", group_id="g"),
        item("c0", data_source="code"),
        item("m2", data_source="math"),
    ]
    base = salted(1)
    flaky = salted(2, poison=["m2"], request_batch_size=2)  # chunk [m0, m1] scores, [m2] fails
    with RewardPanel(
        [
            PanelTerm("base", base),
            PanelTerm("flaky", flaky, weight=10.0, applicable_datasets=["math"], required=False),
        ]
    ) as panel:
        response = panel.compute_rewards(RewardRequest(items=items))
        assert response.term_failures == [
            TermFailure(
                term="flaky",
                ids=["m0", "m1", "m2"],
                error=response.term_failures[0].error,
                kind="ScorerRequestError",
            )
        ]
        assert "'m2' is poison" in response.term_failures[0].error
        assert response.component_rewards["flaky"] == [None] * 4  # none of it was attached
        assert response.applicable["flaky"] == [True, True, False, True]
        assert response.rewards == [salted_value(1, i.id) for i in items]
        assert "flaky" not in response.diagnostics and response.successes == [
            False,
            False,
            True,
            False,
        ]
        assert all(
            "term 'flaky' failed" in e
            for e in (response.errors[0], response.errors[1], response.errors[3])
        )
        # the optional term does not apply to it: its reward is whole
        assert response.errors[2] is None
        # the failure belongs to that call only
        clean = panel.compute_rewards(RewardRequest(items=items[:3]))
    assert clean.term_failures == []
    assert clean.component_rewards["flaky"] == [salted_value(2, "m0"), salted_value(2, "m1"), None]


def test_a_term_with_nothing_to_score_takes_no_part_in_a_failure_of_its_backend():
    """A required term that applies to no item of the request is not failed by its backend's failure
    on an optional term's items, and no empty failure is reported for it."""
    shared = salted(2, poison=["c0"])
    with RewardPanel(
        [
            PanelTerm("base", salted(1)),
            PanelTerm("code", shared, applicable_datasets=["code"], required=False),
            PanelTerm("chat", shared, applicable_datasets=["chat"], required=True),
        ]
    ) as panel:
        response = panel.compute_rewards(
            RewardRequest(items=[item("c0", data_source="code"), item("m0")])
        )
        assert [(f.term, f.ids) for f in response.term_failures] == [("code", ["c0"])]
        assert set(response.diagnostics) == {"base"}
        # now "chat" has an item in the call: the failed call is scored again for chat's item alone
        both = panel.compute_rewards(
            RewardRequest(items=[item("c0", data_source="code"), item("h0", data_source="chat")])
        )
        assert [(f.term, f.ids) for f in both.term_failures] == [("code", ["c0"])]
        assert both.component_rewards["chat"] == [None, salted_value(2, "h0")]
        # chat's own item fails: fatal
        with pytest.raises(ScorerRequestError, match="'h0' is poison"):
            chat_poison = salted(2, poison=["c0", "h0"])
            with RewardPanel(
                [
                    PanelTerm("code", chat_poison, applicable_datasets=["code"], required=False),
                    PanelTerm("chat", chat_poison, applicable_datasets=["chat"]),
                ]
            ) as other:
                other.compute_rewards(
                    RewardRequest(
                        items=[item("h0", data_source="chat"), item("c0", data_source="code")]
                    )
                )


def test_an_optional_managed_term_whose_child_crashed_is_recorded_but_one_that_cannot_boot_is_fatal(
    managed, trainer_python, tmp_path
):
    """A crash fails that call (recorded for an optional term, the next call restarts the child); a
    child that cannot boot again is a setup failure: fatal whatever the term."""
    child = managed(
        trainer_python,
        "tests.helpers.fixture_scorers:BootsOnce",
        params={"marker": str(tmp_path / "m")},
        restart={"backoff_s": 0},
    )
    request = RewardRequest(items=[item("a0"), item("b0")])
    with RewardPanel(
        [PanelTerm("base", salted(1)), PanelTerm("boots", child, weight=5.0, required=False)]
    ) as panel:
        assert panel.compute_rewards(request).component_rewards["boots"] == [1.0, 1.0]
        kill_and_wait(child.pid)
        crashed = panel.compute_rewards(request)
        assert [(f.term, f.ids, f.kind) for f in crashed.term_failures] == [
            ("boots", ["a0", "b0"], "ScorerProcessDied")
        ]
        assert crashed.rewards == [salted_value(1, "a0"), salted_value(1, "b0")]
        with pytest.raises(ScorerStartupError, match="checkpoint vanished") as info:
            panel.compute_rewards(request)
    assert info.value.returncode == 6
    assert info.value.__notes__ == ["panel term(s) boots: setup failure"]


def test_a_crash_loop_of_an_optional_term_is_fatal(managed, trainer_python):
    child = managed(trainer_python, PROBE, restart={"max_restarts": 0})
    request = RewardRequest(items=[item("a0")])
    with RewardPanel(
        [PanelTerm("base", salted(1)), PanelTerm("len", child, required=False)]
    ) as panel:
        kill_and_wait(child.pid)
        assert [f.kind for f in panel.compute_rewards(request).term_failures] == [
            "ScorerProcessDied"
        ]
        with pytest.raises(ScorerCrashLoop, match="no longer serving"):
            panel.compute_rewards(request)


def test_an_optional_managed_scorer_exception_is_recorded(managed, trainer_python):
    child = managed(trainer_python, "tests.helpers.fixture_scorers:Flaky")
    with RewardPanel(
        [PanelTerm("base", salted(1)), PanelTerm("flaky", child, required=False)]
    ) as panel:
        response = panel.compute_rewards(
            RewardRequest(items=[item("a0", "raise"), item("b0", "ok")])
        )
        assert [(f.term, f.ids) for f in response.term_failures] == [("flaky", ["a0", "b0"])]
        assert "ZeroDivisionError" in response.term_failures[0].error
        assert panel.compute_rewards(RewardRequest(items=[item("a0", "ok")])).component_rewards[
            "flaky"
        ] == [2.0]


class Broken(RewardBackend):
    """A backend with a bug in this process: what it raises is no scorer's verdict."""

    def compute_rewards(self, request: RewardRequest) -> RewardResponse:
        raise KeyError("bug in the trainer process")


def test_an_error_that_is_not_a_scorer_error_is_fatal_even_for_an_optional_term():
    with RewardPanel(
        [PanelTerm("base", salted(1)), PanelTerm("broken", Broken(), required=False)]
    ) as panel:
        with pytest.raises(KeyError, match="bug in the trainer process") as info:
            panel.compute_rewards(RewardRequest(items=[item("a0")]))
    assert info.value.__notes__ == ["panel term(s) broken: not a scorer error"]


def test_a_panel_whose_child_cannot_start_fails_to_build_and_leaves_nothing_running(trainer_python):
    before = my_children()
    config = PanelConfig.model_validate(
        {
            "terms": [
                {"name": "len", "backend": managed_config(trainer_python, PROBE)},
                {
                    "name": "broken",
                    "backend": managed_config(
                        trainer_python, "tests.helpers.fixture_scorers:LoadFails"
                    ),
                    "required": False,
                },
            ]
        }
    )
    pool = BackendPool()
    with pytest.raises(ScorerStartupError, match="missing.safetensors"):
        build_panel(config, pool)
    assert len(pool) == 0
    assert wait_until_gone(list(my_children() - before), 5) == []


# -- concurrency -----------------------------------------------------------------------------------
class BarrierScorer(Scorer):
    """Waits on a shared barrier before scoring: two of them finish only when scored at the same
    time."""

    spec = ScorerSpec(name="barrier", input_kind="text", terms=("barrier",))

    def __init__(self, barrier: threading.Barrier, value: float) -> None:
        self.barrier, self.value = barrier, value

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        self.barrier.wait()  # one after the other: BrokenBarrierError after the barrier's timeout
        return ScoreResult(terms={"barrier": [self.value] * len(items)})


def test_terms_on_different_backends_are_scored_concurrently():
    barrier = threading.Barrier(2, timeout=5)
    started = time.monotonic()
    with RewardPanel(
        [
            PanelTerm("one", LocalRewardBackend(BarrierScorer(barrier, 1.0))),
            PanelTerm("two", LocalRewardBackend(BarrierScorer(barrier, 2.0)), weight=10.0),
        ]
    ) as panel:
        response = panel.compute_rewards(RewardRequest(items=[item("a0")]))
    assert response.rewards == [21.0]
    assert time.monotonic() - started < 4.0


def test_a_managed_and_a_local_term_are_scored_concurrently(managed, trainer_python, tmp_path):
    """Cross-process rendezvous: each scorer waits for the other to have started."""
    here, there = str(tmp_path / "local"), str(tmp_path / "child")
    child = managed(
        trainer_python,
        "tests.helpers.fixture_scorers:Rendezvous",
        params={"arrive": there, "other": here},
    )
    local = LocalRewardBackend(
        "tests.helpers.fixture_scorers:Rendezvous", {"arrive": here, "other": there}
    )
    with RewardPanel([PanelTerm("child", child), PanelTerm("local", local, weight=2.0)]) as panel:
        response = panel.compute_rewards(RewardRequest(items=[item("a0"), item("b0")]))
    assert response.rewards == [3.0, 3.0]
    assert Path(there).read_text() == str(child.pid)


# -- one backend per configuration -----------------------------------------------------------------
def test_train_and_validation_panels_share_one_child_and_closing_both_stops_it(
    trainer_python, tmp_path
):
    journal = tmp_path / "calls"
    backend = managed_config(trainer_python, PROBE, {"journal": str(journal)}, request_batch_size=8)
    train = PanelConfig.model_validate(
        {
            "terms": [
                {"name": "len", "backend": backend, "weight": 1.0},
                {"name": "len_half", "backend": backend, "weight": 0.5, "required": False},
            ]
        }
    )
    validation = PanelConfig.model_validate(
        {
            "terms": [
                {"name": "len", "backend": backend, "weight": 2.0, "applicable_datasets": ["math"]}
            ]
        }
    )
    before = my_children()
    pool = BackendPool()
    train_panel, val_panel = build_panels(Recipe(train, validation), pool)
    try:
        assert val_panel is not None
        started = my_children() - before
        assert len(started) == 1 and len(pool) == 1
        (pid,) = started
        assert train_panel.backends == val_panel.backends and len(train_panel.backends) == 1
        assert train_panel.backends[0].pid == pid
        items = [item("a0", "ab", data_source="math"), item("b0", "abcd", data_source="math")]
        assert train_panel.compute_rewards(RewardRequest(items=items)).rewards == [3.0, 6.0]
        assert val_panel.compute_rewards(RewardRequest(items=items)).rewards == [4.0, 8.0]
        calls = journal_calls(str(journal))
        # one call per panel, both terms in it
        assert calls == [(pid, ["a0", "b0"]), (pid, ["a0", "b0"])]
        train_panel.close()
        assert alive(pid) and len(pool) == 1  # validation still uses it
        assert val_panel.compute_rewards(RewardRequest(items=items[:1])).rewards == [4.0]
    finally:
        train_panel.close()
        if val_panel is not None:
            val_panel.close()
    assert len(pool) == 0
    assert wait_until_gone([pid], 5) == []


def test_local_terms_with_one_configuration_share_one_scorer_whatever_their_weights():
    local = {"kind": "local", "scorer": {"name": SALTED, "params": {"salt": 4}}}
    other = {"kind": "local", "scorer": {"name": SALTED, "params": {"salt": 5}}}
    config = PanelConfig.model_validate(
        {
            "terms": [
                {"name": "a", "backend": local, "weight": 1.0},
                {"name": "b", "backend": local, "weight": {"*": 3.0}, "required": False},
                {"name": "c", "backend": other},
            ]
        }
    )
    pool = BackendPool()
    with build_panel(config, pool) as panel:
        assert len(pool) == 2 and len(panel.backends) == 2
        assert panel.terms[0].backend is panel.terms[1].backend is not panel.terms[2].backend
        response = panel.compute_rewards(RewardRequest(items=[item("x0")]))
    assert response.rewards == [4 * salted_value(4, "x0") + salted_value(5, "x0")]
    assert len(pool) == 0


# -- construction ----------------------------------------------------------------------------------
def test_term_name_collisions_fail_at_construction():
    with pytest.raises(ConfigError, match="term name 'len' is used twice"):
        RewardPanel([PanelTerm("len", salted(1)), PanelTerm("len", salted(2), weight=2.0)])
    local = {"kind": "local", "scorer": {"name": SALTED}}
    with pytest.raises(ValidationError, match=r"term names \['len'\] are used more than once"):
        PanelConfig.model_validate(
            {"terms": [{"name": "len", "backend": local}, {"name": "len", "backend": local}]}
        )


def test_panel_identity_covers_weights_required_applicability_and_term_order():
    def panel(*terms: PanelTerm) -> str:
        return RewardPanel(list(terms), owns_backends=False).identity_hash

    one, two = salted(1), salted(2)
    a = PanelTerm("a", one, weight={"math": 2.0, "*": 1.0}, applicable_datasets=["math", "code"])
    b = PanelTerm("b", two, weight=0.5, required=False)
    base = panel(a, b)
    assert (
        base
        == panel(a, b)
        == panel(
            PanelTerm(
                "a", salted(1), weight={"*": 1.0, "math": 2.0}, applicable_datasets=["code", "math"]
            ),
            b,
        )
    )
    changed = [
        panel(a, PanelTerm("b", two, weight=0.25, required=False)),
        panel(a, PanelTerm("b", two, weight=0.5, required=True)),
        panel(a, PanelTerm("b", two, weight=0.5, required=False, applicable_datasets=["math"])),
        panel(
            PanelTerm(
                "a", one, weight={"math": 2.0, "*": 1.5}, applicable_datasets=["math", "code"]
            ),
            b,
        ),
        panel(PanelTerm("a", one, weight={"math": 2.0, "*": 1.0}, applicable_datasets=["math"]), b),
        panel(a, PanelTerm("b", salted(3), weight=0.5, required=False)),  # another scorer identity
        panel(a, PanelTerm("renamed", two, weight=0.5, required=False)),
        # term order is part of the identity (it is the order of the sum and of the metrics)
        panel(b, a),
    ]
    assert len({base, *changed}) == len(changed) + 1
    with RewardPanel([a, b]) as owner:
        assert (
            owner.compute_rewards(
                RewardRequest(items=[item("m0", data_source="math")])
            ).identity_hash
            == base
        )


# -- diagnostics -----------------------------------------------------------------------------------
def test_diagnostics_merge_across_chunks_and_name_metrics_per_term():
    texts = {"a0": "a", "a1": "bb", "b0": "ccc", "b1": "", "c0": "x" * 10}
    items = [
        item(i, t, group_id=i[0], data_source="math" if i[0] == "a" else "code")
        for i, t in texts.items()
    ]
    with RewardPanel(
        [
            PanelTerm("len", LocalRewardBackend(PROBE, request_batch_size=2), weight=0.0),
            PanelTerm(
                "cue",
                LocalRewardBackend(
                    "tests.helpers.fixture_scorers:DiagnosticsOnCue", request_batch_size=3
                ),
            ),
            PanelTerm(
                "math_cue",
                LocalRewardBackend(
                    "tests.helpers.fixture_scorers:DiagnosticsOnCue", request_batch_size=1
                ),
                applicable_datasets=["math"],
                required=False,
            ),
        ]
    ) as panel:
        response = panel.compute_rewards(RewardRequest(items=items))
        again = panel.compute_rewards(RewardRequest(items=items[:2]))
    assert response.diagnostics == {
        # chunks [a0 a1] [b0 b1] [c0]: groups never split
        "len": {"sample_count": 5, "values": {"calls": 3}},
        # chunks [a0 a1] [b0 b1 c0]: counts add up, the mean travels as (sum, count)
        "cue": {"sample_count": 5, "values": {"empties": 1, "length": {"sum": 16.0, "count": 5}}},
        "math_cue": {
            "sample_count": 2,
            "values": {"empties": 0, "length": {"sum": 3.0, "count": 2}},
        },
    }
    assert response.metrics("val") == {
        "val/reward/len/sample_count": 5.0,
        "val/reward/len/calls": 3.0,
        "val/reward/cue/sample_count": 5.0,
        "val/reward/cue/empties": 1.0,
        "val/reward/cue/length": 3.2,  # the mean over items, not the mean of the chunks' means
        "val/reward/math_cue/sample_count": 2.0,
        "val/reward/math_cue/empties": 0.0,
        "val/reward/math_cue/length": 1.5,
    }
    assert set(response.metrics()) == {
        name.replace("val/", "train/", 1) for name in response.metrics("val")
    }
    # two steps, or two ranks
    merged = merge_term_reports([response.diagnostics, again.diagnostics])
    assert merged["cue"] == {
        "sample_count": 7,
        "values": {"empties": 1, "length": {"sum": 19.0, "count": 7}},
    }
    assert merged["len"] == {"sample_count": 7, "values": {"calls": 4}}
    assert to_metrics(merged, "train")["train/reward/cue/length"] == pytest.approx(19 / 7)


def test_a_shared_call_that_times_out_is_not_sent_again_for_the_required_terms_items(
    managed, trainer_python
):
    """A required and an optional term on one child; the call hangs past request_timeout. Narrowing
    to the required term's items is for a scorer's refusal of some items: a timeout fails the call
    once (one timeout, one killed child), never a second send to a restarted child."""
    shared = managed(
        trainer_python, "tests.helpers.fixture_scorers:Flaky", process={"request_timeout": 1.5}
    )
    panel = RewardPanel(
        [
            PanelTerm("chat", shared, applicable_datasets=["chat"]),
            PanelTerm("code", shared, applicable_datasets=["code"], required=False),
        ],
        owns_backends=False,
    )
    request = RewardRequest(
        items=[item("h0", text="slow", data_source="chat"), item("c0", data_source="code")]
    )
    began = time.monotonic()
    with pytest.raises(ScorerTimeout):
        panel.compute_rewards(request)
    # one timeout (re-sent: two, and a restart), counted; and at its deadline, not at the 30 s
    # hang's end (a bound that leaves a loaded machine room)
    assert shared.restarts == 0 and shared.timeouts == 1
    assert time.monotonic() - began < 15


def test_an_optional_term_that_fails_on_one_member_fails_for_its_whole_group():
    """GRPO compares the members of a group: a term missing for one member only would skew every
    advantage of the group. Member g0-1's judge fails: the judge is dropped for all of g0 (recorded
    so), g1 keeps it; with group_failures="raise" the call is refused instead."""
    items = [
        item(f"g{g}-{m}", text="fail" if (g, m) == (0, 1) else f"ok{g}{m}", group_id=f"g{g}")
        for g in (0, 1)
        for m in range(4)
    ]
    request = RewardRequest(items=items, group_size=4)

    def panel(**options) -> RewardPanel:
        return RewardPanel(
            [
                PanelTerm("base", salted(1)),
                PanelTerm(
                    "judge",
                    LocalRewardBackend("tests.helpers.fixture_scorers:FailsMarked"),
                    required=False,
                ),
            ],
            **options,
        )

    with panel() as whole:
        response = whole.compute_rewards(request)
    g0 = [f"g0-{m}" for m in range(4)]
    assert [(f.term, sorted(f.ids)) for f in response.term_failures] == [("judge", g0)]
    assert (
        response.component_rewards["judge"][:4] == [None] * 4
        and None not in response.component_rewards["judge"][4:]
    )
    assert response.rewards[:4] == [salted_value(1, i) for i in g0]
    assert (
        response.successes == [False] * 4 + [True] * 4
        and "term 'judge' failed" in response.errors[0]
    )
    with (
        panel(group_failures="raise") as refusing,
        pytest.raises(ScorerItemsFailed, match="refuses partial groups"),
    ):
        refusing.compute_rewards(request)


def test_an_optional_term_that_fails_on_every_call_warns_once_not_every_call(caplog):
    with RewardPanel(
        [
            PanelTerm("base", salted(1)),
            PanelTerm("warns_once", salted(3, poison=["m0"]), required=False),
        ]
    ) as panel:
        with caplog.at_level("WARNING", logger="supervisor.compose.panel"):
            for _ in range(5):
                assert panel.compute_rewards(RewardRequest(items=[item("m0")])).term_failures
    assert len([r for r in caplog.records if "warns_once" in r.getMessage()]) == 1


def test_a_weighted_sum_that_overflows_is_a_contract_error_not_an_inf_reward():
    exact = LocalRewardBackend("exact_match")
    panel = RewardPanel(
        [PanelTerm("a", exact, weight=1e308), PanelTerm("b", exact, weight=1e308)],
        owns_backends=False,
    )
    request = RewardRequest(items=[RewardItem(id="x", text="1", reference="1")])
    with pytest.raises(
        RewardContractError, match=r"rewards\[0\] \(id='x'\) is inf but marked a success"
    ):
        panel.compute_rewards(request)
    weighted = LocalRewardBackend("exact_match", weights={"exact_match": 1e308})
    assert weighted.compute_rewards(request).rewards == [1e308]
