"""Every endpoint of a real child over real loopback HTTP, with and without the token."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from bench.fault_matrix import rogue_python
from child_runtime.protocol import wire
from supervisor import RewardContractError, RewardItem, RewardRequest, ScorerRequestError
from tests.conftest import wait_in_flight
from tests.helpers.fixture_scorers import journal_calls

ENDPOINTS = [
    ("GET", "/health"),
    ("POST", "/score"),
    ("POST", "/onload"),
    ("POST", "/offload"),
    ("POST", "/drain"),
    ("POST", "/shutdown"),
]


def raw_client(backend, token: str | None, authorization: str | None = None) -> httpx.Client:
    headers = {"authorization": f"Bearer {token}"} if token is not None else {}
    if authorization is not None:
        headers = {"authorization": authorization}
    return httpx.Client(
        base_url=f"http://127.0.0.1:{backend._child.port}",
        headers=headers,
        trust_env=False,
        timeout=10,
    )


def text_request(*texts: str) -> RewardRequest:
    return RewardRequest(items=[RewardItem(id=f"s{i}", text=t) for i, t in enumerate(texts)])


def test_health_reports_identity(managed, trainer_python):
    backend = managed(trainer_python, "tests.helpers.fixture_scorers:Probe")
    health = backend.health()
    root = health.pop("sys_path")[0]
    assert sorted(os.listdir(root)) == ["child_runtime", "scorers"]
    assert health == {
        "state": "ready",
        "scorer": "probe",
        "revision": "1",
        "identity_hash": backend.identity_hash,
        "input_kind": "text",
        "diagnostics": ["calls"],
        "details": [],  # the keys of its per-item details: none
        "groupwise": False,
        "ragged_groups": False,
        "per_candidate": False,
        "required_fields": [],
        "concurrent_calls": 1,
        "pid": backend.pid,
        "in_flight": 0,
        # JSON bodies being parsed now (serve's OpenRLHF route), off the event loop
        "json_parsing": 0,
        "residency": "resident",
        "gpu_residency": "resident",
        "warming": False,  # nothing load() started is still coming up
        # why the scorer can serve no more (a call left a thread running past its deadline)
        "wedged": None,
        "packages": {},
        "terms": ["probe"],
        "python": str(trainer_python),
        "connections": {"pending": 0, "evicted": 0},
        "idempotency": {"entries": 0, "replays": 0},
        "reward_term": None,  # a served panel's weighted reward: a plain scorer has none
        # what a served panel's identity covers (its terms'); None for a plain scorer
        "identity": None,
    }
    assert psutil.Process(backend.pid).exe() == str(
        Path(trainer_python).resolve()
    ) or psutil.Process(backend.pid).cmdline()[0] == str(trainer_python)


def test_score_echoes_ids_and_values(managed, trainer_python):
    backend = managed(trainer_python, "tests.helpers.fixture_scorers:Probe")
    response = backend.compute_rewards(text_request("a", "bbb", "", "cc"))
    assert response.ids == ["s0", "s1", "s2", "s3"]
    assert response.rewards == [1.0, 3.0, 0.0, 2.0]
    assert response.component_rewards == {"probe": [1.0, 3.0, 0.0, 2.0]}
    assert response.successes == [True] * 4


def test_request_batch_size_chunks_requests(managed, trainer_python, tmp_path):
    journal = str(tmp_path / "calls")
    backend = managed(
        trainer_python,
        "tests.helpers.fixture_scorers:Probe",
        params={"journal": journal},
        client={"request_batch_size": 3},
    )
    response = backend.compute_rewards(text_request(*["x" * i for i in range(8)]))
    assert [(pid, len(ids)) for pid, ids in journal_calls(journal)] == [
        (backend.pid, 3),
        (backend.pid, 3),
        (backend.pid, 2),
    ]
    assert response.rewards == [float(i) for i in range(8)]


def test_onload_offload_and_409_when_offloaded(managed, trainer_python):
    backend = managed(trainer_python, "tests.helpers.fixture_scorers:Probe")
    assert backend.offload() == {"residency": "offloaded", "changed": True}
    assert backend.offload() == {"residency": "offloaded", "changed": False}
    assert backend.health()["residency"] == "offloaded"
    with pytest.raises(ScorerRequestError) as info:
        backend.compute_rewards(text_request("a"))
    assert info.value.status == 409 and "offloaded" in str(info.value)
    assert backend.onload() == {"residency": "resident", "changed": True}
    assert backend.compute_rewards(text_request("abc")).rewards == [3.0]


def test_per_call_residency_ends_offloaded(managed, trainer_python):
    backend = managed(
        trainer_python, "tests.helpers.fixture_scorers:Probe", gpu_residency="per_call"
    )
    assert backend.health()["residency"] == "offloaded"
    assert backend.compute_rewards(text_request("ab")).rewards == [2.0]
    assert backend.health()["residency"] == "offloaded"


def test_drain_waits_for_requests_accepted_before_it(managed, trainer_python, tmp_path):
    # the scorer journals a call as it ends: the order, read in the child
    journal = tmp_path / "calls"
    params = {"sleep_s": 1.0, "journal": str(journal)}
    backend = managed(trainer_python, "tests.helpers.fixture_scorers:Probe", params=params)
    scored: list[list[float]] = []
    worker = threading.Thread(
        target=lambda: scored.append(backend.compute_rewards(text_request("slow")).rewards)
    )
    worker.start()
    wait_in_flight(backend)
    result = backend.drain(timeout_s=30)
    # read the moment drain returned
    ended = journal_calls(str(journal)) if journal.exists() else []
    worker.join(timeout=30)
    assert result == {"drained": 1}
    assert len(ended) == 1, "drain returned before the score finished"
    assert scored == [[4.0]]
    assert backend.drain(timeout_s=5) == {"drained": 0}


def test_drain_timeout_is_a_504(managed, trainer_python):
    backend = managed(
        trainer_python, "tests.helpers.fixture_scorers:Probe", params={"sleep_s": 2.0}
    )
    worker = threading.Thread(target=lambda: backend.compute_rewards(text_request("slow")))
    worker.start()
    wait_in_flight(backend)
    with pytest.raises(ScorerRequestError) as info:
        backend.drain(timeout_s=0.2)
    worker.join(timeout=30)
    assert info.value.status == 504


def test_shutdown_endpoint_stops_the_child(managed, trainer_python):
    backend = managed(trainer_python, "tests.helpers.fixture_scorers:Probe")
    with raw_client(backend, backend._child.token) as http:
        assert http.post("/shutdown").json() == {"state": "stopping"}
    assert backend._child.wait_exit(10) and backend._child.returncode() == 0


@pytest.mark.parametrize("method,path", ENDPOINTS)
@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Bearer",
        "Bearer wrong-token-0123456789",
        "Basic dXNlcjpwYXNz",
        "TRUNCATED",
        "TOKEN-ONLY",
    ],
)
def test_every_endpoint_refuses_bad_tokens(managed, trainer_python, method, path, authorization):
    backend = managed(trainer_python, "tests.helpers.fixture_scorers:Probe")
    token = backend._child.token
    authorization = {"TRUNCATED": f"Bearer {token[:-1]}", "TOKEN-ONLY": token}.get(
        authorization, authorization
    )
    with raw_client(backend, None, authorization) as http:
        response = http.request(method, path)
    assert response.status_code == 401
    assert backend._child.token not in response.text
    assert backend.health()["state"] == "ready"  # still serving, not shut down


def test_token_of_another_child_is_refused(managed, trainer_python):
    first = managed(trainer_python, "tests.helpers.fixture_scorers:Probe")
    second = managed(trainer_python, "tests.helpers.fixture_scorers:Probe")
    with raw_client(second, first._child.token) as http:
        assert http.get("/health").status_code == 401


def test_token_never_in_argv_or_log(managed, trainer_python):
    backend = managed(trainer_python, "tests.helpers.fixture_scorers:Probe")
    backend.compute_rewards(text_request("a"))
    token = backend._child.token
    assert token not in " ".join(psutil.Process(backend.pid).cmdline())
    assert token not in Path(backend.log_path).read_text()


BAD_BODIES = {
    "empty": b"",
    "json": b'{"items": []}',
    "bad magic": b"NOTAFRAME" + b"\0" * 32,
    "truncated buffer": wire.encode(
        {"items": [{"id": "a", "image": np.zeros((4, 4, 3), np.uint8)}]}
    )[:-40],
    "truncated header": wire.encode(
        {"items": [{"id": "a", "image": np.zeros((4, 4, 3), np.uint8)}]}
    )[:30],
    "trailing bytes": wire.encode({"items": [{"id": "a", "text": "x"}]}) + b"\0" * 100,
    "no items": wire.encode({"things": []}),
    "empty items": wire.encode({"items": []}),
    "duplicate ids": wire.encode({"items": [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}]}),
    "unknown field": wire.encode({"items": [{"id": "a", "text": "x", "colour": "red"}]}),
    "id not a string": wire.encode({"items": [{"id": 3, "text": "x"}]}),
    "float image": wire.encode({"items": [{"id": "a", "image": np.zeros((4, 4, 3), np.float32)}]}),
}


@pytest.mark.parametrize("name", sorted(BAD_BODIES))
def test_bad_bodies_get_4xx_and_child_keeps_serving(managed, trainer_python, name):
    backend = managed(trainer_python, "tests.helpers.fixture_scorers:Probe")
    with raw_client(backend, backend._child.token) as http:
        response = http.post("/score", content=BAD_BODIES[name])
    assert 400 <= response.status_code < 500, response.text
    assert response.json()["error"]
    assert backend.compute_rewards(text_request("abcd")).rewards == [4.0]


def test_missing_required_field_is_422_naming_it(managed, trainer_python):
    backend = managed(trainer_python, "exact_match")
    with pytest.raises(ScorerRequestError) as info:
        backend.compute_rewards(RewardRequest(items=[RewardItem(id="q1", text="4")]))
    assert info.value.status == 422
    assert "reference" in str(info.value) and "q1" in str(info.value)
    ok = backend.compute_rewards(
        RewardRequest(items=[RewardItem(id="q1", text=" 4 ", reference={"answer": "4"})])
    )
    assert ok.rewards == [1.0]


def test_scorer_exception_is_500_with_its_message(managed, trainer_python):
    backend = managed(trainer_python, "tests.helpers.fixture_scorers:Raises")
    with pytest.raises(ScorerRequestError) as info:
        backend.compute_rewards(text_request("a"))
    assert info.value.status == 500 and "ZeroDivisionError: scorer bug on purpose" in str(
        info.value
    )
    assert info.value.pid == backend.pid
    assert backend.health()["state"] == "ready"


@pytest.mark.parametrize(
    "scorer",
    ["tests.helpers.fixture_scorers:ReturnsNaN", "tests.helpers.fixture_scorers:WrongCount"],
)
def test_contract_breaking_scorers_are_refused_in_the_child(managed, trainer_python, scorer):
    backend = managed(trainer_python, scorer)
    with pytest.raises(ScorerRequestError) as info:
        backend.compute_rewards(text_request("a", "b"))
    assert info.value.kind == "contract"


def test_parent_refuses_answers_for_the_wrong_ids(managed, trainer_python, tmp_path):
    backend = managed(rogue_python(tmp_path, trainer_python), "tests.helpers.fixture_scorers:Probe")
    with pytest.raises(RewardContractError) as info:
        backend.compute_rewards(text_request("a", "bb", "ccc"))
    assert "position 0 echoes id 's1', expected 's0'" in str(info.value)
    assert info.value.pid == backend.pid


def test_jpeg_scorer_in_image_env_matches_in_process(managed, image_python):
    from supervisor import LocalRewardBackend

    rng = np.random.default_rng(0)
    images = [
        rng.integers(0, 255, (96, 128, 3), dtype=np.uint8),
        np.full((96, 128, 3), 200, np.uint8),
    ]
    request = RewardRequest(
        items=[RewardItem(id=f"img{i}", image=im) for i, im in enumerate(images)]
    )
    backend = managed(image_python, "jpeg_compressibility", input_kind="image")
    with LocalRewardBackend("jpeg_compressibility") as local:
        assert backend.compute_rewards(request).rewards == local.compute_rewards(request).rewards
