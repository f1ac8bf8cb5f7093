"""Catalog identity and pins, custom catalogs, and the diagnostics contract: in-process and in a
child.

A configured revision or identity hash is a pin: a child whose scorer differs is refused at
start with the BAD_CONFIG boot code and never restarted; a LocalRewardBackend refuses it
before load(). The identity hash covers what decides verdicts (params with defaults applied,
resolved env vars, credential references) and nothing else (worker counts, secret values).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from child_runtime.protocol import exit_codes
from scorers.base import Scorer
from scorers.builtin.math_verify import TIMEOUT_ENV
from scorers.builtin.rules import ExactMatch
from scorers.identity import canonical_json, scorer_document, scorer_identity_hash
from scorers.pointwise import map_candidates
from scorers.registry import CatalogError, UnknownScorerError, load_catalog, resolve_scorer
from supervisor import (
    ConfigError,
    LocalRewardBackend,
    ManagedScorerProcessBackend,
    ManagedScorerProcessSpec,
    RewardContractError,
    RewardItem,
    RewardRequest,
    ScorerRequestError,
    ScorerStartupError,
)
from tests.conftest import REPO_ROOT, alive
from tests.helpers.fixture_scorers import DiagnosticsOnCue, Keyword, NoOffloadMarksLoad

CATALOG = "tests.helpers.fixture_scorers:catalog"
OVERRIDING = "tests.helpers.fixture_scorers:overriding_catalog"
SECRET = "sk-fixture-secret-0123456789"
WRONG_HASH = "f" * 64


def identity(
    scorer: str | type[Scorer], params: dict | None = None, catalog: str | None = None
) -> str:
    """The identity hash of a scorer (a name resolved through `catalog`, or a class) built with
    `params`."""
    cls = resolve_scorer(scorer, catalog) if isinstance(scorer, str) else scorer
    params = dict(params or {})
    return scorer_identity_hash(cls(**params), params)


@pytest.fixture(autouse=True)
def _no_timeout_env(monkeypatch):
    """Identities here are computed without $MATH_VERIFY_TIMEOUT_S unless a test sets it."""
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)


def descendants() -> set[int]:
    return {proc.pid for proc in psutil.Process().children(recursive=True)}


@pytest.fixture
def child(trainer_python, tmp_path):
    """start(scorer_config, process=...) -> a started ManagedScorerProcessBackend, closed at the
    end. Every launch leaves one log file in `tmp_path / "logs"` (a failed boot keeps its log)."""
    made: list[ManagedScorerProcessBackend] = []

    def start(
        scorer: dict[str, Any], process: dict[str, Any] | None = None
    ) -> ManagedScorerProcessBackend:
        config = ManagedScorerProcessSpec(
            process={
                "python_executable": str(trainer_python),
                "startup_timeout": 60,
                "request_timeout": 60,
                "extra_import_paths": [str(REPO_ROOT)],
                "log_dir": str(tmp_path / "logs"),
                **(process or {}),
            },
            scorer=scorer,
            client={"input_kind": scorer.get("input_kind", "text")},
        )
        backend = ManagedScorerProcessBackend(config, start=False)
        made.append(backend)
        backend.start()
        return backend

    yield start
    for backend in made:
        backend.close()


def launches(tmp_path: Path) -> int:
    return len(list((tmp_path / "logs").glob("*.log")))


def texts(*values: str) -> RewardRequest:
    return RewardRequest(
        items=[RewardItem(id=f"i{n}", text=value) for n, value in enumerate(values)]
    )


# -- pins on a managed child ------------------------------------------------------------------
@pytest.mark.parametrize("pin", ["revision", "identity_hash"])
def test_a_pin_that_differs_refuses_the_child_and_it_is_never_restarted(child, tmp_path, pin):
    actual = {"revision": "1", "identity_hash": identity("exact_match")}[pin]
    wrong = {"revision": "2", "identity_hash": WRONG_HASH}[pin]
    before = descendants()
    with pytest.raises(ScorerStartupError) as info:
        child({"name": "exact_match", pin: wrong})
    error = info.value
    message = str(error)
    assert f"{pin} pin" in message and "refused" in message
    assert wrong in message and actual in message, (
        "the refusal must name both the pin and the scorer's own"
    )
    assert error.boot_code == exit_codes.BAD_CONFIG and error.returncode == exit_codes.BAD_CONFIG
    assert exit_codes.is_boot_failure(error.boot_code)
    assert error.pid is not None and not alive(error.pid)
    assert descendants() == before, "the refused child (or something it started) is still there"
    assert launches(tmp_path) == 1, "a child refused for its pin was launched again"


def test_matching_pins_start_and_health_reports_the_local_identity(child):
    params = {"case_sensitive": True}
    with LocalRewardBackend("exact_match", params) as local:
        expected = local.identity_hash
    assert expected is not None and expected != identity("exact_match")
    backend = child(
        {"name": "exact_match", "params": params, "revision": "1", "identity_hash": expected}
    )
    health = backend.health()
    assert (health["scorer"], health["revision"], health["identity_hash"]) == (
        "exact_match",
        "1",
        expected,
    )
    assert backend.identity_hash == backend.ready_info["identity_hash"] == expected
    response = backend.compute_rewards(
        RewardRequest(items=[RewardItem(id="a", text="Yes", reference="yes")])
    )
    # case-sensitive: the params arrived
    assert response.rewards == [0.0] and response.identity_hash == expected


# -- pins on a local backend ------------------------------------------------------------------
@pytest.mark.parametrize(("pin", "wrong"), [("revision", "2"), ("identity_hash", WRONG_HASH)])
def test_a_local_backend_refuses_a_pin_before_load(tmp_path, pin, wrong):
    marker = tmp_path / "loaded"
    params = {"marker": str(marker)}
    name = "tests.helpers.fixture_scorers:NoOffloadMarksLoad"
    with pytest.raises(ConfigError, match=f"{pin} pin .*refused") as info:
        LocalRewardBackend(name, params, **{pin: wrong})
    assert wrong in str(info.value)
    assert not marker.exists(), "the scorer loaded although its pin was refused"
    right = {"revision": "1", "identity_hash": identity(NoOffloadMarksLoad, params)}[pin]
    with LocalRewardBackend(name, params, **{pin: right}):
        assert marker.exists()


# -- the identity hash --------------------------------------------------------------------------
def test_the_hash_is_the_sha256_of_the_canonical_document():
    params = {"case_sensitive": True}
    document = scorer_document(ExactMatch(**params), params)
    assert document == {
        "name": "exact_match",
        "revision": "1",
        "input_kind": "text",
        "terms": ["exact_match"],
        "diagnostics": [],
        "groupwise": False,
        "ragged_groups": False,
        "identity": None,
        "params": {"case_sensitive": True},
    }
    canonical = json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode()
    assert canonical_json(document) == canonical
    assert identity("exact_match", params) == hashlib.sha256(canonical).hexdigest()


IN_ANOTHER_PROCESS = """
import json, sys
from scorers.identity import scorer_identity_hash
from scorers.registry import resolve_scorer
cases = json.loads(sys.argv[1])
out = {}
for key, (name, params, catalog) in cases.items():
    params = dict(reversed(list(params.items())))  # another key order
    out[key] = scorer_identity_hash(resolve_scorer(name, catalog)(**params), params)
print(json.dumps(out))
"""


def test_the_hash_is_stable_across_processes():
    cases = {
        "exact_match": ("exact_match", {"case_sensitive": True}, None),
        "math": (
            "math_verify",
            {"jobs": 1, "timeout_s": 2.5, "on_timeout": "raise", "strict": False},
            None,
        ),
        "keyword": ("keyword", {"keyword": "ok", "api_key_env": "JUDGE_KEY"}, CATALOG),
        "video": ("video", {"inner": "jpeg_compressibility", "frames": 4}, None),
    }
    here = {key: identity(name, params, catalog) for key, (name, params, catalog) in cases.items()}
    for seed in ("0", "1", "12345"):
        result = subprocess.run(
            [sys.executable, "-c", IN_ANOTHER_PROCESS, json.dumps(cases)],
            env={**os.environ, "PYTHONHASHSEED": seed},
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout) == here


@pytest.mark.parametrize(
    ("name", "explicit", "catalog"),
    [
        ("exact_match", {"case_sensitive": False}, None),
        (
            "math_verify",
            {"float_rounding": 6, "numeric_precision": 15, "strict": True, "on_timeout": "zero"},
            None,
        ),
        ("math_verify", {"timeout_s": 10}, None),  # the default timeout, as an int
        ("math_verify", {"timeout_s": None}, None),  # None means the default too
        ("constant", {"value": 1.0}, None),
        ("keyword", {"keyword": "yes", "api_key_env": "FIXTURE_JUDGE_KEY"}, CATALOG),
    ],
)
def test_passing_a_default_explicitly_does_not_change_the_hash(name, explicit, catalog):
    assert identity(name, explicit, catalog) == identity(name, {}, catalog)


@pytest.mark.parametrize(
    ("name", "params", "catalog"),
    [
        ("exact_match", {"case_sensitive": True}, None),
        ("math_verify", {"timeout_s": 2.0}, None),
        ("math_verify", {"on_timeout": "raise"}, None),
        ("math_verify", {"strict": False}, None),
        ("math_verify", {"float_rounding": 3}, None),
        ("constant", {"value": 0.5}, None),
        ("keyword", {"keyword": "no"}, CATALOG),
    ],
)
def test_a_verdict_changing_param_changes_the_hash(name, params, catalog):
    assert identity(name, params, catalog) != identity(name, {}, catalog)


def test_a_nonsemantic_param_does_not_change_the_hash():
    hashes = {identity("math_verify", {"jobs": jobs}) for jobs in (1, 2, 8)} | {
        identity("math_verify")
    }
    hashes |= {identity("math_verify", {"soft_timeout_s": 0.5, "overflow": 0})}
    assert len(hashes) == 1
    assert (
        "jobs" not in scorer_document(resolve_scorer("math_verify")(jobs=3), {"jobs": 3})["params"]
    )


def test_every_verdict_changing_param_is_in_the_document():
    document = scorer_document(resolve_scorer("math_verify")(jobs=2), {"jobs": 2})
    assert document["params"] == {
        "timeout_s": 10.0,
        "float_rounding": 6,
        "numeric_precision": 15,
        "strict": True,
        "on_timeout": "zero",
        # an item past it scores 0; soft_timeout_s and overflow only move work
        "memory_cap_mb": 512,
        "memory_budget_mb": 512,  # held items past it together: the largest score 0
    }


def test_math_verify_timeout_env_var_is_resolved_into_the_hash(monkeypatch):
    default = identity("math_verify", {"jobs": 1})
    monkeypatch.setenv(TIMEOUT_ENV, "3")
    from_env = identity("math_verify", {"jobs": 1})
    assert from_env != default
    # same verdicts, same identity
    assert from_env == identity("math_verify", {"jobs": 1, "timeout_s": 3})
    # an explicit param wins over it
    assert identity("math_verify", {"jobs": 1, "timeout_s": 10.0}) == default
    monkeypatch.setenv(TIMEOUT_ENV, "10")
    assert identity("math_verify", {"jobs": 1}) == default
    monkeypatch.setenv(TIMEOUT_ENV, "  ")  # blank: not set
    assert identity("math_verify", {"jobs": 1}) == default


@pytest.mark.parametrize(
    "spec",
    [
        {"revision": "2"},
        {"identity": {"prompt_sha256": "ab12"}},
        {"terms": ("other",)},
        {"input_kind": "image"},
    ],
)
def test_what_the_spec_declares_is_part_of_the_hash(spec):
    def always(candidate, context) -> float:
        return 1.0

    base = map_candidates(always, name="always")
    changed = map_candidates(always, name="always", **spec)
    # the same declaration: the same hash
    assert identity(base) == identity(map_candidates(always, name="always"))
    assert identity(changed) != identity(base)


def test_a_credential_reference_is_identity_but_the_secret_never_is(monkeypatch):
    monkeypatch.setenv("JUDGE_KEY_A", SECRET)
    monkeypatch.setenv("JUDGE_KEY_B", SECRET)
    by_a = identity(Keyword, {"api_key_env": "JUDGE_KEY_A"})
    assert by_a != identity(Keyword, {"api_key_env": "JUDGE_KEY_B"}), (
        "the reference (which key) is identity"
    )
    for value in ("sk-another-secret", ""):
        monkeypatch.setenv("JUDGE_KEY_A", value)
        assert identity(Keyword, {"api_key_env": "JUDGE_KEY_A"}) == by_a, (
            "the secret value changed the identity"
        )
    monkeypatch.delenv("JUDGE_KEY_A")
    assert identity(Keyword, {"api_key_env": "JUDGE_KEY_A"}) == by_a
    monkeypatch.setenv("JUDGE_KEY_A", SECRET)
    document = canonical_json(
        scorer_document(Keyword(api_key_env="JUDGE_KEY_A"), {"api_key_env": "JUDGE_KEY_A"})
    )
    assert b"JUDGE_KEY_A" in document and SECRET.encode() not in document
    with LocalRewardBackend("keyword", {"api_key_env": "JUDGE_KEY_A"}, catalog=CATALOG) as backend:
        # the key is read when scoring, never hashed
        response = backend.compute_rewards(texts("yes", "no"))
        assert response.rewards == [1.0, 0.0] and response.identity_hash == by_a


# -- custom catalogs ---------------------------------------------------------------------------
def test_a_catalog_factory_adds_names():
    assert load_catalog(None) == {}
    assert load_catalog(CATALOG) == {
        "keyword": Keyword,
        "keyword_by_path": "tests.helpers.fixture_scorers:Keyword",
    }
    assert resolve_scorer("keyword", CATALOG) is Keyword
    assert resolve_scorer("keyword_by_path", CATALOG) is Keyword
    assert resolve_scorer("exact_match", CATALOG) is ExactMatch, (
        "built-ins resolve alongside a catalog"
    )
    with pytest.raises(UnknownScorerError, match="'keyword'"):
        resolve_scorer("keyword")  # only through its catalog
    with pytest.raises(UnknownScorerError, match=f"catalog '{CATALOG}'"):
        resolve_scorer("no_such_name", CATALOG)


@pytest.mark.parametrize("name", ["keyword", "exact_match", "EXACT_MATCH", "constant"])
def test_a_catalog_that_overrides_a_built_in_is_refused_whatever_name_is_asked(name):
    with pytest.raises(
        CatalogError, match="'exact_match' is a built-in scorer and cannot be overridden"
    ):
        resolve_scorer(name, OVERRIDING)


@pytest.mark.parametrize(
    ("catalog", "fragment"),
    [
        ("tests.helpers.fixture_scorers:catalog_needing_args", "must take no arguments"),
        (
            "tests.helpers.fixture_scorers:catalog_not_a_mapping",
            "returned list, expected a mapping",
        ),
        (
            "tests.helpers.fixture_scorers:catalog_of_a_non_scorer",
            "'keyword' must map to a Scorer subclass",
        ),
        # a scorer is not a catalog
        ("tests.helpers.fixture_scorers:Keyword", "returned Keyword, expected a mapping"),
        ("tests.helpers.fixture_scorers:SECRET_CATALOG", "has no 'SECRET_CATALOG'"),
        (
            "tests.fixture_scorers_missing:catalog",
            "cannot import module 'tests.fixture_scorers_missing'",
        ),
        ("catalog", "is not a dotted path"),
    ],
)
def test_a_catalog_that_breaks_the_factory_contract_is_refused(catalog, fragment):
    with pytest.raises(CatalogError, match=fragment) as info:
        resolve_scorer("keyword", catalog)
    assert repr(catalog) in str(info.value)


def test_a_catalog_path_to_a_non_scorer_is_refused_when_resolved():
    with pytest.raises(UnknownScorerError, match="not a Scorer subclass"):
        resolve_scorer("keyword", "tests.helpers.fixture_scorers:catalog_of_a_path_to_a_non_scorer")


def test_a_managed_child_scores_with_a_catalog_scorer(child, monkeypatch):
    monkeypatch.setenv("FIXTURE_JUDGE_KEY", SECRET)  # the child inherits the trainer's environment
    params = {"keyword": "ok"}
    request = texts("OK then", "nope", "it is ok")
    with LocalRewardBackend("keyword", params, catalog=CATALOG) as local:
        expected, in_process = local.identity_hash, local.compute_rewards(request).rewards
    backend = child({"name": "keyword", "catalog": CATALOG, "params": params, "revision": "kw-1"})
    health = backend.health()
    assert (health["scorer"], health["revision"], health["identity_hash"]) == (
        "keyword",
        "kw-1",
        expected,
    )
    assert health["groupwise"] is True
    assert SECRET not in json.dumps(health) and SECRET not in json.dumps(backend.ready_info)
    assert backend.compute_rewards(request).rewards == in_process == [1.0, 0.0, 1.0]


@pytest.mark.parametrize(
    ("catalog", "process", "code", "fragment"),
    [
        (OVERRIDING, None, exit_codes.BAD_CONFIG, "'exact_match' is a built-in scorer"),
        (
            CATALOG,
            {"extra_import_paths": []},
            exit_codes.SCORER_IMPORT_FAILED,
            "cannot import module",
        ),
    ],
)
def test_a_child_refuses_a_catalog_it_cannot_use(child, tmp_path, catalog, process, code, fragment):
    with pytest.raises(ScorerStartupError, match=fragment) as info:
        child({"name": "keyword", "catalog": catalog}, process=process)
    assert info.value.boot_code == code and exit_codes.is_boot_failure(code)
    assert launches(tmp_path) == 1


# -- the diagnostics contract -------------------------------------------------------------------
CUES = sorted(DiagnosticsOnCue.CUES)
DIAGNOSTICS_ON_CUE = "tests.helpers.fixture_scorers:DiagnosticsOnCue"


def contract_fragment(cue: str) -> str:
    name = next(iter(DiagnosticsOnCue.CUES[cue]))
    return f"undeclared diagnostic {name!r}" if cue == "undeclared" else f"diagnostic {name!r} ="


def test_declared_counts_and_means_are_merged_across_chunks():
    with LocalRewardBackend(DIAGNOSTICS_ON_CUE, request_batch_size=2) as backend:
        response = backend.compute_rewards(texts("ok", "", "abcd", "xy", "z"))
    assert response.rewards == [2.0, 0.0, 4.0, 2.0, 1.0]
    assert response.diagnostics == {
        "diagnostics_on_cue": {
            "sample_count": 5,
            "values": {"empties": 1, "length": {"sum": 9.0, "count": 5}},
        }
    }


@pytest.mark.parametrize("cue", CUES)
def test_local_diagnostics_that_break_the_contract_are_contract_errors(cue):
    with LocalRewardBackend(DIAGNOSTICS_ON_CUE, request_batch_size=1) as backend:
        # the first chunk is fine and scored; the call still raises: no response, nothing partial
        with pytest.raises(RewardContractError, match="diagnostics_on_cue") as info:
            backend.compute_rewards(texts("ok", cue))
        assert contract_fragment(cue) in str(info.value)
        assert backend.compute_rewards(texts("ok")).rewards == [2.0]


@pytest.mark.parametrize(
    ("text", "fragment"), [("undeclared", "undeclared diagnostic 'surprise'"), ("bad", "'mean'")]
)
def test_bad_diagnostics_fixture_is_a_local_contract_error(text, fragment):
    with LocalRewardBackend("tests.helpers.fixture_scorers:BadDiagnostics") as backend:
        with pytest.raises(RewardContractError, match=fragment):
            backend.compute_rewards(texts(text))


def test_a_childs_diagnostics_that_break_the_contract_are_contract_errors(managed, trainer_python):
    """The child checks what its scorer reports: a typed contract error (HTTP 500 "contract"), the
    whole call fails even when an earlier chunk was fine, and the child keeps serving."""
    backend = managed(trainer_python, DIAGNOSTICS_ON_CUE, client={"request_batch_size": 1})
    pid = backend.pid
    for cue in CUES:
        with pytest.raises(ScorerRequestError) as info:
            backend.compute_rewards(texts("ok", cue))
        assert info.value.status == 500 and info.value.kind == "contract", cue
        assert "diagnostics_on_cue" in str(info.value) and contract_fragment(cue) in str(
            info.value
        ), cue
    assert backend.pid == pid and backend.restarts == 0
    response = backend.compute_rewards(texts("ok", "", "abcd"))
    assert response.diagnostics == {
        "diagnostics_on_cue": {
            "sample_count": 3,
            "values": {"empties": 1, "length": {"sum": 6.0, "count": 3}},
        }
    }


def test_bad_diagnostics_fixture_undeclared_in_a_child(managed, trainer_python):
    backend = managed(trainer_python, "tests.helpers.fixture_scorers:BadDiagnostics")
    with pytest.raises(ScorerRequestError, match="undeclared diagnostic 'surprise'") as info:
        backend.compute_rewards(texts("undeclared"))
    assert info.value.kind == "contract"
    assert backend.compute_rewards(texts("fine")).rewards == [2.0]
