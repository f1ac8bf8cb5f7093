"""preflight(recipe): every misconfiguration is named, per term, before any process starts.

Each misconfiguration runs under `no_process`: every way Python starts a process (subprocess,
fork, posix_spawn, os.spawn*, os.system, multiprocessing) and every outbound connection is
replaced by a recorder that refuses, and the test process must have no new descendants after
preflight. Only the equality check at the end starts a child, outside that fixture.
"""

from __future__ import annotations

import _posixsubprocess
import multiprocessing.process
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from scorers.builtin.math_verify import TIMEOUT_ENV, MathVerifyScorer
from scorers.builtin.rules import ExactMatch
from scorers.identity import scorer_identity_hash
from supervisor import LocalRewardBackend, PreflightError, PreflightReport, load_recipe, preflight
from supervisor.backends.managed import ManagedScorerProcessBackend
from supervisor.ops.preflight import CHILD_RUNTIME_MODULES
from tests.conftest import REPO_ROOT, env_python
from tests.helpers import fixture_scorers

CATALOG = "tests.helpers.fixture_scorers:catalog"
PIN = "0" * 64
TOKEN_ENV = "PREFLIGHT_TEST_TOKEN"
SPAWNERS = (
    "fork",
    "forkpty",
    "posix_spawn",
    "posix_spawnp",
    "spawnv",
    "spawnve",
    "spawnvp",
    "spawnvpe",
    "system",
)


# -- recipe builders (the plain `terms:` style unless a test says otherwise) --------------------
def managed(
    name: str,
    scorer: str,
    python: Path | str = sys.executable,
    process: dict | None = None,
    client: dict | None = None,
    **scorer_fields: Any,
) -> dict:
    return {
        "name": name,
        "backend": {
            "kind": "managed",
            "process": {
                "python_executable": str(python),
                "extra_import_paths": [str(REPO_ROOT)],
                **(process or {}),
            },
            "scorer": {"name": scorer, **scorer_fields},
            "client": {"input_kind": scorer_fields.get("input_kind", "text"), **(client or {})},
        },
    }


def local(
    name: str,
    scorer: str,
    client: dict | None = None,
    term: dict | None = None,
    **scorer_fields: Any,
) -> dict:
    return {
        "name": name,
        "backend": {
            "kind": "local",
            "scorer": {"name": scorer, **scorer_fields},
            "client": {"input_kind": scorer_fields.get("input_kind", "text"), **(client or {})},
        },
        **(term or {}),
    }


def remote(name: str, token_env: str | None = None) -> dict:
    # port 9 (discard): never contacted
    backend = {"kind": "remote", "base_url": "http://127.0.0.1:9"}
    if token_env is not None:
        backend["token_env"] = token_env
    return {"name": name, "backend": backend}


def panel(*terms: dict) -> dict:
    return {"terms": list(terms)}


# -- the guard --------------------------------------------------------------------------------
@pytest.fixture
def no_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every process start and outbound connection is recorded and refused; none may happen."""
    attempts: list[str] = []

    def refuser(what: str) -> Callable[..., Any]:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            attempts.append(what)
            raise AssertionError(f"preflight tried {what}")

        return refuse

    monkeypatch.setattr(subprocess.Popen, "__init__", refuser("subprocess.Popen"))
    monkeypatch.setattr(_posixsubprocess, "fork_exec", refuser("_posixsubprocess.fork_exec"))
    for name in SPAWNERS:
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuser(f"os.{name}"))
    monkeypatch.setattr(
        multiprocessing.process.BaseProcess, "start", refuser("multiprocessing start")
    )
    monkeypatch.setattr(socket.socket, "connect", refuser("socket.connect"))
    monkeypatch.setattr(socket.socket, "connect_ex", refuser("socket.connect_ex"))
    monkeypatch.setattr(socket, "create_connection", refuser("socket.create_connection"))
    before = {proc.pid for proc in psutil.Process().children(recursive=True)}
    yield attempts
    monkeypatch.undo()  # psutil itself needs nothing of the above, but be certain
    started = {proc.pid for proc in psutil.Process().children(recursive=True)} - before
    assert attempts == [], f"preflight tried to start a process or connect: {attempts}"
    assert not started, f"preflight left new descendants: {sorted(started)}"


def test_the_guard_catches_a_process_start(no_process):
    """The guard itself must be able to fail: each spawner it patches refuses and is recorded."""
    with pytest.raises(AssertionError):
        subprocess.run(["true"])
    with pytest.raises(AssertionError):
        os.posix_spawn("/bin/true", ["true"], {})
    with pytest.raises(AssertionError):
        multiprocessing.get_context("spawn").Process(target=print).start()
    assert no_process == ["subprocess.Popen", "os.posix_spawn", "multiprocessing start"]
    no_process.clear()  # consumed: the fixture's own check must not fail this test


def refused(recipe: dict) -> list[str]:
    """The problems preflight names for `recipe`; it must raise PreflightError with the same
    list."""
    with pytest.raises(PreflightError) as info:
        preflight(recipe)
    problems = info.value.problems
    assert problems and all(problem in str(info.value) for problem in problems)
    assert preflight(recipe, raise_on_problems=False).problems == problems
    return problems


def named(problems: list[str], place: str, *fragments: str) -> str:
    """The one problem that names `place` (e.g. 'reward.judge') and says every fragment."""
    found = [p for p in problems if p.startswith(f"{place}:") and all(f in p for f in fragments)]
    assert len(found) == 1, f"no single problem for {place} saying {fragments}:\n" + "\n".join(
        problems
    )
    return found[0]


# -- each misconfiguration, one at a time -----------------------------------------------------
def test_unknown_scorer_name(no_process):
    problems = refused(panel(local("judge", "no_such_scorer")))
    # lists the known names
    named(problems, "reward.judge", "unknown scorer 'no_such_scorer'", "exact_match")
    assert len(problems) == 1


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        # a typo: the nearest, the valid ones
        ({"case_sensitiv": True}, "did you mean 'case_sensitive'?"),
        # a TypeError of the scorer's own
        ({"case_sensitive": "yes"}, "case_sensitive must be a bool"),
    ],
)
def test_bad_params_type_error(no_process, params, fragment):
    problems = refused(panel(local("em", "exact_match", params=params)))
    named(problems, "reward.em", "scorer 'exact_match' params", fragment)


def test_bad_params_value_error(no_process):
    problems = refused(panel(managed("math", "math_verify", params={"on_timeout": "retry"})))
    named(
        problems,
        "reward.math",
        "scorer 'math_verify' params",
        "on_timeout must be 'zero' or 'raise'",
    )


def test_a_constructor_that_fails_otherwise_is_a_problem_too(no_process):
    """Constructors must be cheap; one that raises something else is still named, not a crash of
    preflight."""
    problems = refused(
        panel(
            local("gpu", "tests.helpers.fixture_scorers:ConstructorRaises"), local("ok", "constant")
        )
    )
    named(problems, "reward.gpu", "RuntimeError", "no GPU driver loaded")
    assert len(problems) == 1


def test_revision_pin_mismatch(no_process):
    problems = refused(panel(managed("em", "exact_match", revision="2")))
    named(problems, "reward.em", "revision pin '2'", "'exact_match' is '1'")
    assert len(problems) == 1


def test_identity_hash_pin_mismatch(no_process):
    actual = scorer_identity_hash(ExactMatch(case_sensitive=True), {"case_sensitive": True})
    problems = refused(
        panel(managed("em", "exact_match", params={"case_sensitive": True}, identity_hash=PIN))
    )
    named(problems, "reward.em", f"identity_hash pin {PIN}", actual)
    assert len(problems) == 1


def test_a_pin_taken_with_other_params_is_a_mismatch(no_process):
    """A hash pinned for the default params refuses a verdict-changing param."""
    default = scorer_identity_hash(ExactMatch(), {})
    problems = refused(
        panel(local("em", "exact_match", params={"case_sensitive": True}, identity_hash=default))
    )
    named(problems, "reward.em", f"identity_hash pin {default}")


def test_component_that_is_not_a_scorer_term(no_process):
    problems = refused(panel(local("acc", "exact_match", term={"component": "accuracy"})))
    named(problems, "reward.acc", "component 'accuracy'", "exact_match")


def test_required_rewards_naming_an_unknown_term(no_process):
    problems = refused(
        panel(managed("em", "exact_match", client={"required_rewards": ["accuracy"]}))
    )
    named(problems, "reward.em", "required_rewards/weights ['accuracy']", "exact_match")


def test_input_kind_mismatch(no_process):
    problems = refused(panel(managed("bright", "mean_intensity", input_kind="text")))
    named(problems, "reward.bright", "input_kind 'text'", "'mean_intensity' takes 'image'")


def test_python_executable_missing(no_process, tmp_path):
    missing = tmp_path / "envs" / "math" / ".venv" / "bin" / "python"
    problems = refused(
        panel(local("ok", "constant"), managed("math", "math_verify", python=missing))
    )
    problem = named(
        problems, "reward.math", "python_executable", str(missing), "not an executable file"
    )
    assert "managed-scorers envs build" in problem


def test_python_executable_missing_in_a_verl_omni_recipe(no_process, tmp_path):
    missing = tmp_path / "python"
    recipe = {
        "reward": {
            "models": {
                "grader": {
                    "backend": "managed",
                    "scorer": "exact_match",
                    "python_executable": str(missing),
                }
            },
            "reward_functions": {"correct": {"model": "grader"}},
        }
    }
    named(refused(recipe), "reward.correct", "python_executable", str(missing))


def test_an_env_that_lacks_a_module_the_scorer_needs(no_process):
    image = env_python("image")
    problems = refused(panel(managed("math", "math_verify", python=image, params={"jobs": 1})))
    env = str(image.parent.parent)
    named(problems, "reward.math", env, "cannot import 'math_verify'")
    named(problems, "reward.math", env, "cannot import 'sympy'")
    assert len(problems) == 2


def test_a_python_that_is_not_a_venv(no_process, tmp_path):
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.symlink_to(sys.executable)
    named(
        refused(panel(managed("em", "exact_match", python=python))),
        "reward.em",
        "is not a venv's python",
    )


def test_an_env_without_the_child_runtime(no_process, tmp_path):
    """A venv of the right Python whose site-packages is empty: the child runtime cannot run
    there."""
    root = tmp_path / "bare"
    (root / "bin").mkdir(parents=True)
    (root / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (root / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.7\n")
    (root / "bin" / "python").symlink_to(sys.executable)
    problems = refused(panel(managed("em", "exact_match", python=root / "bin" / "python")))
    for module in CHILD_RUNTIME_MODULES:
        named(problems, "reward.em", f"cannot import {module!r}")


def test_a_dotted_path_scorer_the_child_cannot_import(no_process):
    """The parent can import tests.helpers.fixture_scorers (it runs from the repo); the child would
    not."""
    problems = refused(
        panel(
            managed(
                "probe", "tests.helpers.fixture_scorers:Probe", process={"extra_import_paths": []}
            )
        )
    )
    named(problems, "reward.probe", "cannot import 'tests'", "extra_import_paths")
    assert len(problems) == 1


def test_a_catalog_the_child_cannot_import(no_process):
    problems = refused(
        panel(managed("kw", "keyword", catalog=CATALOG, process={"extra_import_paths": []}))
    )
    named(problems, "reward.kw", "cannot import 'tests'", CATALOG)


def test_a_catalog_that_overrides_a_built_in(no_process):
    catalog = "tests.helpers.fixture_scorers:overriding_catalog"
    problems = refused(
        panel(
            local("kw", "keyword", catalog=catalog), managed("em", "exact_match", catalog=catalog)
        )
    )
    named(problems, "reward.kw", "'exact_match' is a built-in scorer and cannot be overridden")
    named(problems, "reward.em", "'exact_match' is a built-in scorer and cannot be overridden")


@pytest.mark.parametrize(
    ("factory", "fragment"),
    [
        ("catalog_needing_args", "must take no arguments"),
        ("catalog_not_a_mapping", "returned list"),
        ("catalog_of_a_non_scorer", "must map to a Scorer subclass"),
        ("no_such_factory", "has no 'no_such_factory'"),
    ],
)
def test_a_catalog_that_breaks_the_factory_contract(no_process, factory, fragment):
    catalog = f"tests.helpers.fixture_scorers:{factory}"
    named(refused(panel(local("kw", "keyword", catalog=catalog))), "reward.kw", catalog, fragment)


def test_a_remote_term_whose_token_is_not_set(no_process, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    problems = refused(panel(remote("judge", token_env=TOKEN_ENV)))
    named(problems, "reward.judge", f"environment variable {TOKEN_ENV}", "not set")
    monkeypatch.setenv(TOKEN_ENV, "")  # set but empty is no token either
    named(refused(panel(remote("judge", token_env=TOKEN_ENV))), "reward.judge", TOKEN_ENV)


def test_duplicate_term_names(no_process):
    problems = refused(
        panel(local("em", "exact_match"), local("em", "constant"), local("ok", "constant"))
    )
    assert len(problems) == 1 and "term names ['em'] are used more than once" in problems[0], (
        problems
    )


def test_verl_omni_recipe_names_its_functions(no_process):
    recipe = {
        "reward": {
            "models": {"grader": {"backend": "local", "scorer": "exact_match", "revision": "7"}},
            "reward_functions": {"correct": {"model": "grader"}},
            "val_reward_functions": {"val_correct": {"model": "grader", "component": "accuracy"}},
        }
    }
    problems = refused(recipe)
    named(problems, "reward.correct", "revision pin '7'")
    named(problems, "validation.val_correct", "revision pin '7'")
    named(problems, "validation.val_correct", "component 'accuracy'")


# -- many at once -------------------------------------------------------------------------------
def test_every_problem_is_reported_not_only_the_first(no_process, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    recipe = panel(
        local("unknown", "no_such_scorer"),
        managed(
            "pinned",
            "exact_match",
            revision="2",
            identity_hash=PIN,
            client={"required_rewards": ["accuracy"]},
        ),
        local("acc", "exact_match", term={"component": "accuracy"}),
        managed("math", "math_verify", python=env_python("image"), params={"jobs": 1}),
        managed("kw", "keyword", catalog="tests.helpers.fixture_scorers:overriding_catalog"),
        remote("judge", token_env=TOKEN_ENV),
        local("fine", "constant"),
    )
    problems = refused(recipe)
    named(problems, "reward.unknown", "unknown scorer")
    named(problems, "reward.pinned", "revision pin '2'")
    named(problems, "reward.pinned", "identity_hash pin")
    named(problems, "reward.pinned", "required_rewards/weights ['accuracy']")
    named(problems, "reward.acc", "component 'accuracy'")
    named(problems, "reward.math", "cannot import 'math_verify'")
    named(problems, "reward.math", "cannot import 'sympy'")
    named(problems, "reward.kw", "cannot be overridden")
    named(problems, "reward.judge", TOKEN_ENV)
    assert len(problems) == 9
    assert not [p for p in problems if p.startswith("reward.fine:")]


# -- a clean recipe ---------------------------------------------------------------------------
def clean_recipe(marker: Path) -> dict:
    return panel(
        local("em", "exact_match", params={"case_sensitive": True}, revision="1"),
        managed("kw", "keyword", catalog=CATALOG, params={"keyword": "ok"}, revision="kw-1"),
        managed(
            "marks",
            "tests.helpers.fixture_scorers:NoOffloadMarksLoad",
            params={"marker": str(marker)},
        ),
        remote("judge", token_env=TOKEN_ENV),
    )


def test_a_clean_recipe_passes_and_reports_each_scorer(no_process, monkeypatch, tmp_path):
    monkeypatch.setenv(TOKEN_ENV, "token-value-not-checked-here")
    marker = tmp_path / "loaded"
    report = preflight(clean_recipe(marker))
    assert isinstance(report, PreflightReport) and report.ok and report.problems == []
    assert not marker.exists(), "preflight loaded a scorer (load() ran)"
    assert report.scorers == {
        "em": {
            "scorer": "exact_match",
            "revision": "1",
            "identity_hash": scorer_identity_hash(
                ExactMatch(case_sensitive=True), {"case_sensitive": True}
            ),
        },
        "kw": {
            "scorer": "keyword",
            "revision": "kw-1",
            "identity_hash": scorer_identity_hash(
                fixture_scorers.Keyword(keyword="ok"), {"keyword": "ok"}
            ),
        },
        "marks": {
            "scorer": "no_offload_marks_load",
            "revision": "1",
            "identity_hash": scorer_identity_hash(
                fixture_scorers.NoOffloadMarksLoad(str(marker)), {"marker": str(marker)}
            ),
        },
    }
    # pinning exactly what preflight reported passes preflight again
    pinned = clean_recipe(marker)
    for term in pinned["terms"]:
        if term["name"] in report.scorers:
            term["backend"]["scorer"]["identity_hash"] = report.scorers[term["name"]][
                "identity_hash"
            ]
    assert preflight(pinned).ok


def test_a_clean_verl_omni_recipe_passes(no_process):
    recipe = {
        "reward": {
            "models": {
                "grader": {
                    "backend": "managed",
                    "scorer": "exact_match",
                    "python_executable": sys.executable,
                },
                "kw": {
                    "backend": "managed",
                    "scorer": "keyword",
                    "catalog": CATALOG,
                    "python_executable": sys.executable,
                    "extra_import_paths": [str(REPO_ROOT)],
                },
            },
            "reward_functions": {
                "correct": {"model": "grader"},
                "kw": {"weight": 0.5, "required": False},
            },
            "val_reward_functions": {"correct": {"model": "grader"}},
        }
    }
    report = preflight(recipe)
    assert report.ok and sorted(report.scorers) == ["correct", "kw", "validation.correct"]


def test_what_preflight_reports_is_what_the_child_and_the_local_backend_serve(
    monkeypatch, tmp_path
):
    """Outside the no-process guard: one managed child, started from the recipe preflight passed."""
    monkeypatch.setenv(TOKEN_ENV, "token-value-not-checked-here")
    monkeypatch.setenv("FIXTURE_JUDGE_KEY", "the-secret-itself")
    recipe = clean_recipe(tmp_path / "loaded")
    report = preflight(recipe)
    terms = {term.name: term for term in load_recipe(recipe).train.terms}
    with ManagedScorerProcessBackend(terms["kw"].backend) as backend:
        health = backend.health()
        assert (health["scorer"], health["revision"], health["identity_hash"]) == tuple(
            report.scorers["kw"][key] for key in ("scorer", "revision", "identity_hash")
        )
        assert backend.identity_hash == report.scorers["kw"]["identity_hash"]
    em = terms["em"].backend.scorer
    with LocalRewardBackend(
        em.name, em.params, revision=em.revision, catalog=em.catalog
    ) as backend:
        assert backend.identity_hash == report.scorers["em"]["identity_hash"]


def test_preflight_resolves_the_identity_in_the_childs_environment(monkeypatch):
    """A verdict-changing env var set for the child (process.env) is the child's, not the trainer's:
    preflight's identity must be the one the child serves, or a pin copied from it would refuse
    it."""
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    process = {"env": {TIMEOUT_ENV: "3"}}
    report = preflight(panel(managed("math", "math_verify", params={"jobs": 1}, process=process)))
    # the child sees MATH_VERIFY_TIMEOUT_S=3: the same verdicts as timeout_s=3
    expected = scorer_identity_hash(
        MathVerifyScorer(jobs=1, timeout_s=3.0), {"jobs": 1, "timeout_s": 3.0}
    )
    assert expected != scorer_identity_hash(MathVerifyScorer(jobs=1), {"jobs": 1})
    assert report.scorers["math"]["identity_hash"] == expected
    assert TIMEOUT_ENV not in os.environ, "preflight leaked the child's env into the trainer's"
    pinned = panel(
        managed("math", "math_verify", params={"jobs": 1}, process=process, identity_hash=expected)
    )
    assert preflight(pinned).ok
    # the pin holds
    with ManagedScorerProcessBackend(load_recipe(pinned).train.terms[0].backend) as backend:
        assert backend.health()["identity_hash"] == expected


def test_per_call_residency_for_a_scorer_that_cannot_offload(no_process):
    recipe = {
        "reward": {
            "models": {"exact": {"backend": "managed", "scorer": "exact_match", "offload": True,
                                 "python_executable": str(env_python("image"))}},
            "reward_functions": {"exact": {}},
        }
    }  # fmt: skip
    with pytest.raises(PreflightError) as info:
        preflight(recipe)
    assert any(
        p.startswith("reward.exact:")
        and "per_call (offload: true) needs a scorer that can offload" in p
        for p in info.value.problems
    ), info.value.problems
