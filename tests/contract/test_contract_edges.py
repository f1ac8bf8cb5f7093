"""Edges found by review: shared scorers across threads, answers that leave a term out, identity of
what a panel term means, recipes that would run code, and scorers that live only in their env."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pytest

from supervisor import (
    ConfigError,
    LocalRewardBackend,
    PanelConfig,
    PanelTerm,
    RemoteRewardBackend,
    RewardContractError,
    RewardItem,
    RewardPanel,
    RewardRequest,
    ScorerRequestError,
    load_recipe,
    preflight,
)
from supervisor.chunks import CallPlan, ChunkAnswer, score_in_chunks
from supervisor.shape import ScorerShape
from supervisor.verify import verify_score_answer
from tests.conftest import env_python
from tests.helpers.fixture_scorers import Exclusive

TEXTS = RewardRequest(items=[RewardItem(id=f"s{i}", text="abc") for i in range(4)])


def test_a_local_backend_serialises_callers_from_several_threads():
    """One backend may serve a training and a validation panel from their threads."""
    errors: list[BaseException] = []
    with LocalRewardBackend(
        "tests.helpers.fixture_scorers:Exclusive", request_batch_size=1
    ) as backend:

        def call() -> None:
            try:
                assert backend.compute_rewards(TEXTS).rewards == [1.0] * 4
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=call) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert errors == [] and Exclusive.inside == 0


def test_a_scorer_instance_has_no_identity_and_cannot_be_pinned():
    from scorers.builtin.rules import ExactMatch

    with LocalRewardBackend(ExactMatch(case_sensitive=True)) as backend:
        assert backend.identity_hash is None
    with pytest.raises(ConfigError, match="cannot be pinned"):
        LocalRewardBackend(ExactMatch(), revision="1")


def test_panel_identity_covers_how_a_backend_combines_its_own_terms():
    def panel(**kwargs) -> RewardPanel:
        return RewardPanel(
            [
                PanelTerm(
                    "t", LocalRewardBackend("tests.helpers.fixture_scorers:TwoTermImage", **kwargs)
                )
            ]
        )

    plain, weighted, required = (
        panel(),
        panel(weights={"penalty": 0.1}),
        panel(required_rewards=["aesthetic"]),
    )
    assert len({plain.identity_hash, weighted.identity_hash, required.identity_hash}) == 3
    component = RewardPanel(
        [
            PanelTerm(
                "t",
                LocalRewardBackend("tests.helpers.fixture_scorers:TwoTermImage"),
                component="aesthetic",
            )
        ]
    )
    other = RewardPanel(
        [
            PanelTerm(
                "t",
                LocalRewardBackend(
                    "tests.helpers.fixture_scorers:TwoTermImage", weights={"penalty": 0.1}
                ),
                component="aesthetic",
            )
        ]
    )
    # a component does not depend on the combination
    assert component.identity_hash == other.identity_hash
    for p in (plain, weighted, required, component, other):
        p.close()


DECLARED = ScorerShape("s", ("a", "b"), diagnostics=("n",))


def answer(**terms: np.ndarray) -> dict:
    return {"ids": ["x", "y"], "terms": terms, "diagnostics": {}}


def test_an_answer_must_carry_exactly_the_declared_terms_and_diagnostics():
    ok = {"a": np.ones(2), "b": np.zeros(2)}
    assert set(verify_score_answer(answer(**ok), ["x", "y"], ["a"], declared=DECLARED)[0]) == {
        "a",
        "b",
    }
    with pytest.raises(
        RewardContractError, match=r"answer has terms \['a'\]; scorer 's' declared \['a', 'b'\]"
    ):
        verify_score_answer(answer(a=np.ones(2)), ["x", "y"], ["a"], declared=DECLARED)
    with pytest.raises(RewardContractError, match="declared"):
        verify_score_answer(answer(**ok, c=np.ones(2)), ["x", "y"], ["a"], declared=DECLARED)
    bad = {**answer(**ok), "diagnostics": {"surprise": 1}}
    with pytest.raises(RewardContractError, match="undeclared diagnostic 'surprise'"):
        verify_score_answer(bad, ["x", "y"], ["a"], declared=DECLARED)


@dataclass(frozen=True)
class Answering:
    """A ChunkScorer whose every chunk gets `answer()`."""

    answer: Callable[[], ChunkAnswer]

    def score_chunk(self, chunk: Sequence[RewardItem], group_size: int | None) -> ChunkAnswer:
        return self.answer()

    def interrupt(self) -> None:
        return None


def test_a_term_one_chunk_left_out_is_never_zero_filled():
    calls = iter(
        [
            ChunkAnswer({"a": np.ones(2), "b": np.ones(2)}, {}, {}, {}),
            ChunkAnswer({"a": np.ones(2)}, {}, {}, {}),
        ]
    )
    request = RewardRequest(items=[RewardItem(id=f"i{k}", text="t") for k in range(4)])
    with pytest.raises(RewardContractError, match="term 'b': no score for id 'i2'"):
        score_in_chunks(request, CallPlan(DECLARED, 2, ["a"]), Answering(lambda: next(calls)))


def test_a_term_that_does_not_apply_is_none_and_never_a_reward_term():
    """`not_applicable` on the wire: that term's component is None there (applicable False), the
    item a success; the same mark on a term of the reward breaks the contract, and so does an
    unknown id."""
    values = {"a": np.array([1.0, 2.0]), "b": np.array([0.5, np.nan])}
    answer = {"ids": ["x", "y"], "terms": values, "not_applicable": {"b": ["y"]}}
    checked = verify_score_answer(answer, ["x", "y"], ["a"], declared=DECLARED)
    assert checked.not_applicable == {"b": frozenset({"y"})}
    request = RewardRequest(items=[RewardItem(id=i, text="t") for i in ("x", "y")])
    response = score_in_chunks(
        request, CallPlan(DECLARED, 2, ["a"]), Answering(lambda: checked)
    ).result()
    assert response.rewards == [1.0, 2.0] and response.component_rewards["b"] == [0.5, None]
    assert response.applicable == {"b": [True, False]} and response.usable() == [True, True]
    assert response.successes == [True, True]
    with pytest.raises(RewardContractError, match=r"terms \['b'\] of the reward do not apply"):
        score_in_chunks(request, CallPlan(DECLARED, 2, ["a", "b"]), Answering(lambda: checked))
    with pytest.raises(RewardContractError, match="non-finite score nan for id 'y'"):
        verify_score_answer(
            {**answer, "not_applicable": {"b": ["x"]}}, ["x", "y"], ["a"], declared=DECLARED
        )
    with pytest.raises(RewardContractError, match="names ids \\['z'\\]"):
        verify_score_answer(
            {**answer, "not_applicable": {"b": ["y", "z"]}}, ["x", "y"], ["a"], declared=DECLARED
        )


def test_a_remote_scorer_failure_is_not_retried(managed, trainer_python, tmp_path):
    """A 500 of kind scorer_error is the scorer's verdict on this request: sending it again rescores
    it."""
    journal = tmp_path / "journal"
    server = managed(
        trainer_python, "tests.helpers.fixture_scorers:Journal", params={"path": str(journal)}
    )
    with RemoteRewardBackend(
        f"http://127.0.0.1:{server._child.port}", token=server._child.token
    ) as remote:
        with pytest.raises(ScorerRequestError, match="fails on cue"):
            remote.compute_rewards(RewardRequest(items=[RewardItem(id="r", text="raise")]))
    assert journal.read_text().splitlines() == ["r"]


def test_a_recipe_target_must_be_a_config_class(tmp_path):
    marker = tmp_path / "ran"
    recipe = {"_target_": "os.mkdir", "path": str(marker)}
    with pytest.raises(ConfigError, match="'os.mkdir' is not a config class"):
        load_recipe(recipe)
    assert not marker.exists()


def test_verl_omni_python_functions_are_refused_by_name():
    recipe = {
        "reward": {
            "models": {"m": {"backend": "local", "scorer": "token_f1"}},
            "reward_functions": {
                "f": {"model": "m", "path": "pkg://mine.reward", "name": "compute_score"}
            },
        }
    }
    with pytest.raises(
        ConfigError, match=r"reward.reward_functions.f: `path`/`name` \(a Python scoring function\)"
    ):
        load_recipe(recipe)


@pytest.mark.parametrize(
    "term, needle",
    [
        ({"name": "has space"}, "String should match pattern"),
        ({"name": "ok", "applicable_datasets": []}, "at least 1 item"),
    ],
)
def test_term_names_and_applicability_are_checked_before_anything_starts(term, needle):
    backend = {"kind": "local", "scorer": {"name": "token_f1"}}
    with pytest.raises(ValueError, match=needle):
        PanelConfig.model_validate({"terms": [{**term, "backend": backend}]})


def test_a_panel_and_its_backend_must_agree_on_the_group_size():
    backend = {"kind": "local", "scorer": {"name": "token_f1"}, "client": {"group_size": 4}}
    with pytest.raises(
        ValueError, match="client.group_size 4 differs from the panel's group_size 8"
    ):
        PanelConfig.model_validate({"group_size": 8, "terms": [{"name": "t", "backend": backend}]})


def test_preflight_leaves_a_scorer_that_lives_only_in_its_env_to_the_child(tmp_path):
    """The module is in the scorer env's site-packages, not the trainer's: not a problem, a note."""
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    real = env_python("image").parent.parent / "lib" / "python3.11" / "site-packages"
    # what the child runtime needs, as the env has it
    for module in ("numpy", "starlette", "uvicorn"):
        (site / module).symlink_to(real / module)
    (site / "envonly_reward.py").write_text("raise ImportError('only importable in the env')\n")
    (venv / "bin").mkdir()
    (venv / "bin" / "python").symlink_to(env_python("image"))
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.7\n")
    backend = {
        "process": {"python_executable": str(venv / "bin" / "python")},
        "scorer": {"name": "envonly_reward:Len"},
    }
    report = preflight({"terms": [{"name": "len", "backend": backend}]})
    assert report.ok and len(report.notes) == 1 and report.notes[0].startswith("reward.len:"), (
        report
    )
    missing = {
        "process": {"python_executable": str(venv / "bin" / "python")},
        "scorer": {"name": "nowhere:Len"},
    }
    problems = preflight(
        {"terms": [{"name": "len", "backend": missing}]}, raise_on_problems=False
    ).problems
    assert any("cannot import module 'nowhere'" in p for p in problems), problems


def test_a_nested_panels_optional_failures_reach_the_outer_response():
    inner = RewardPanel(
        [
            PanelTerm("base", LocalRewardBackend("constant")),
            PanelTerm(
                "judge", LocalRewardBackend("tests.helpers.fixture_scorers:Raises"), required=False
            ),
        ]
    )
    with RewardPanel([PanelTerm("quality", inner)]) as outer:
        response = outer.compute_rewards(RewardRequest(items=[RewardItem(id="a", text="t")]))
    assert [(f.term, f.ids) for f in response.term_failures] == [("quality.judge", ["a"])]
    assert response.rewards == [1.0]
