"""Hostile input: size, count, length and shape limits answered 4xx, and the child keeps serving."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from child_runtime.protocol import wire
from supervisor import RewardItem, RewardRequest, ScorerRequestError

LIMITS = {"max_request_bytes": 4096, "max_items": 3, "max_text_chars": 10, "max_media_bytes": 100}


@pytest.fixture
def child(managed, trainer_python):
    return managed(trainer_python, "tests.helpers.fixture_scorers:Probe", limits=LIMITS)


def post(backend, body, **kwargs) -> httpx.Response:
    headers = {"authorization": f"Bearer {backend._child.token}", **kwargs.pop("headers", {})}
    with httpx.Client(
        base_url=f"http://127.0.0.1:{backend._child.port}", trust_env=False, timeout=10
    ) as http:
        return http.post("/score", content=body, headers=headers, **kwargs)


def still_serving(backend) -> None:
    assert backend.compute_rewards(
        RewardRequest(items=[RewardItem(id="ok", text="abcd")])
    ).rewards == [4.0]


def test_oversized_body_is_413_by_content_length(child):
    response = post(child, b"\0" * 5000)
    assert response.status_code == 413 and "max_request_bytes=4096" in response.json()["error"]
    still_serving(child)


def test_oversized_chunked_body_is_413_while_streaming(child):
    response = post(child, (b"\0" * 1024 for _ in range(8)))  # no content-length: chunked
    assert response.status_code == 413
    still_serving(child)


def test_parent_refuses_to_send_what_the_child_would_refuse(child):
    big = RewardRequest(items=[RewardItem(id="a", text="x" * 10, reference={"pad": "y" * 5000})])
    with pytest.raises(ScorerRequestError) as info:
        child.compute_rewards(big)
    assert info.value.status == 413 and "lower request_batch_size" in str(info.value)
    assert child.health()["in_flight"] == 0
    still_serving(child)


@pytest.mark.parametrize(
    "items,needle",
    [
        ([{"id": f"i{k}", "text": "a"} for k in range(4)], "request.items has 4 items (limit 3)"),
        ([{"id": "a", "text": "x" * 11}], "items[0].text has 11 characters (limit 10)"),
        ([{"id": "a", "prompt": "p" * 11}], "items[0].prompt has 11 characters (limit 10)"),
        ([{"id": "a" * 1025}], "items[0].id must be a non-empty string of at most 1024 characters"),
        (
            [{"id": "a", "image": np.zeros((6, 6, 3), np.uint8)}],
            "items[0].image has 108 bytes (limit 100)",
        ),
        (
            [{"id": "a", "video": np.zeros((2, 6, 6, 3), np.uint8)}],
            "items[0].video has 216 bytes (limit 100)",
        ),
        ([{"id": "a", "image": np.zeros((2, 2, 3), np.float32)}], "must be uint8 HWC"),
        ([{"id": "a", "image": np.full((2, 2, 3), np.nan, np.float64)}], "must be uint8 HWC"),
        ([{"id": "a", "text": "x", "extra": 1}], "unknown fields ['extra']"),
    ],
)
def test_limit_violations_are_400_naming_the_field(child, items, needle):
    response = post(child, wire.encode({"items": items}))
    assert response.status_code == 400 and needle in response.json()["error"], response.text
    still_serving(child)


def test_media_under_the_limit_is_accepted(child):
    response = post(
        child,
        wire.encode(
            {"items": [{"id": "a", "text": "t", "video": np.zeros((2, 3, 3, 3), np.uint8)}]}
        ),
    )
    assert response.status_code == 200


def test_limits_are_validated():
    from pydantic import ValidationError

    from supervisor import LimitsConfig

    with pytest.raises(ValidationError, match="max_items"):
        LimitsConfig(max_items=0)


@pytest.mark.parametrize("field", ["reference", "metadata"])
def test_strings_inside_reference_and_metadata_obey_the_text_limit(child, field):
    value = {"answer": ["ok", {"deep": "z" * 11}]}
    response = post(child, wire.encode({"items": [{"id": "a", "text": "x", field: value}]}))
    assert response.status_code == 400
    assert (
        f"items[0].{field} holds a string of 11 characters (limit 10)" in response.json()["error"]
    )
    still_serving(child)
