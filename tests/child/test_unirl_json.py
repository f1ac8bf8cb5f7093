"""/score's JSON form, UniRL's reward-service protocol: its requests read as items, its answers
built from a scorer's result (child_runtime.protocol.unirl), in process; the served route is tested
in tests/ops/test_serve_json.py."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from child_runtime.protocol.items import Limits, RequestError, request_from_wire
from child_runtime.protocol.unirl import IdentityMismatch, answer, parse
from scorers.base import ScoreResult, ScorerSpec

IDENTITY = "ab" * 32
TEXT = ScorerSpec(name="exact_match", input_kind="text", terms=("exact_match",))
TWO_TERMS = ScorerSpec(name="judge", input_kind="text", terms=("correct", "format"))
PANEL = ScorerSpec(
    name="panel", input_kind="text", terms=("correct", "format", "weighted"), reward_term="weighted"
)


def png(value: int, size: tuple[int, int] = (5, 4)) -> str:
    buffer = io.BytesIO()
    Image.fromarray(np.full((size[1], size[0], 3), value, np.uint8)).save(buffer, "PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def call(*requests: dict, **top) -> dict:
    return {"protocol_version": "1", "requests": list(requests), **top}


def test_a_text_request_is_an_item_with_its_prompt_gold_group_and_echoed_identity():
    request = {
        "history": [{"text": "What is 2+2?"}, {"text": "4"}],
        "metadata": {"reference": "4", "data_source": "gsm8k", "step": 3},
        "request_id": "r0",
        "sample_id": "s0",
        "group_id": 7,
        "source_rank": 1,
        "policy_version": 5,
        "idempotency_key": "k",
    }
    parsed = parse(call(request), TEXT, IDENTITY, Limits())
    [item] = request_from_wire(parsed.wire)[0]
    assert (item.id, item.prompt, item.text, item.reference) == ("r0", "What is 2+2?", "4", "4")
    assert (item.group_id, item.data_source, item.metadata["step"]) == ("7", "gsm8k", 3)
    assert parsed.identities == [
        {
            "request_id": "r0",
            "sample_id": "s0",
            "group_id": 7,  # echoed as sent: UniRL compares it
            "source_rank": 1,
            "policy_version": 5,
            "idempotency_key": "k",
            "scorer_version": IDENTITY,
        }
    ]
    assert parsed.rewards == ("exact_match",) and parsed.terms == ["exact_match"]


def test_an_image_request_decodes_its_image_and_earlier_turns_as_condition_images():
    request = {
        "history": [
            {"text": "brighter", "image_b64": png(10)},
            {"text": "brighter", "image_b64": png(200)},
        ]
    }
    parsed = parse(
        call({**request, "request_id": "e"}, protocol_version=1), TEXT, IDENTITY, Limits()
    )
    [item] = request_from_wire(parsed.wire)[0]
    assert item.prompt == "brighter" and item.text is None
    assert (
        item.image.shape == (4, 5, 3)
        and item.image.dtype == np.uint8
        and int(item.image[0, 0, 0]) == 200
    )
    assert [int(c[0, 0, 0]) for c in item.condition_images] == [10]


@pytest.mark.parametrize(
    "body, says",
    [
        ([], "must be a JSON object"),
        (
            call({"history": [{"text": "x"}], "request_id": "a"}, protocol_version="2"),
            "protocol_version must be",
        ),
        (
            {"requests": [{"history": [{"text": "x"}], "request_id": "a"}]},
            "protocol_version must be",
        ),
        (
            call({"history": [{"text": "x"}], "request_id": "a"}, protocol_version=True),
            "protocol_version must be",
        ),
        (
            call({"history": [{"text": "x"}], "request_id": "a"}, extra=1),
            "unknown fields ['extra']",
        ),
        (call(), "requests must be a non-empty list"),
        (call({"history": [{"text": "x"}]}), "request_id must be a non-empty string"),
        (
            call({"history": [{"text": "x"}], "request_id": "a", "prompt": "p"}),
            "unknown fields ['prompt']",
        ),
        (call({"history": [], "request_id": "a"}), "history must be a list of 1 to"),
        (
            call({"history": [{"video_b64": "AAAA", "image_b64": png(1)}], "request_id": "a"}),
            "a turn holds one medium",
        ),
        (
            call({"history": [{"text": "p"}, {"video_b64": "AAAA"}], "request_id": "a"}),
            "of a video item is one turn",
        ),
        (call({"history": [{"image_b64": "not base64!"}], "request_id": "a"}), "is not base64"),
        (call({"history": [{"image_b64": "AAAA"}], "request_id": "a"}), "is not a readable image"),
        (
            call({"history": [{"text": "p"}, {"image_b64": png(1)}], "request_id": "a"}),
            "has no image",
        ),
        (
            call({"history": [{"text": "a"}, {"text": "b"}, {"text": "c"}], "request_id": "a"}),
            "of a text item",
        ),
        (
            call({"history": [{"text": "x"}], "request_id": "a", "required_rewards": ["hps"]}),
            "['hps'] are not served",
        ),
        (
            call(
                {
                    "history": [{"text": "x"}],
                    "request_id": "a",
                    "required_rewards": ["exact_match"],
                },
                {"history": [{"text": "y"}], "request_id": "b"},
            ),
            "requests[1].required_rewards differs",
        ),
        (
            call({"history": [{"text": "x"}], "request_id": "a", "group_id": 1.5}),
            "group_id must be a string",
        ),
        (
            call({"history": [{"text": "x"}], "request_id": "a", "metadata": [1]}),
            "metadata must be an object",
        ),
    ],
)
def test_a_malformed_request_is_refused_in_one_line_naming_what(body, says):
    with pytest.raises(RequestError) as refused:
        parse(body, TEXT, IDENTITY, Limits())
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_decoded_pixels_are_counted_from_the_header_against_the_limits_before_decoding():
    one = {"history": [{"image_b64": png(1, (100, 100))}], "request_id": "a"}
    with pytest.raises(RequestError, match="decodes to 30000 bytes .limit max_media_bytes=29999"):
        parse(call(one), TEXT, IDENTITY, Limits(max_media_bytes=29999))
    two = [one, {**one, "request_id": "b"}]
    with pytest.raises(RequestError, match="decode to more than max_request_bytes"):
        parse(call(*two), TEXT, IDENTITY, Limits(max_request_bytes=59999))
    with pytest.raises(RequestError, match="requests has 2 entries .limit 1"):
        parse(call(*two), TEXT, IDENTITY, Limits(max_items=1))


def test_a_pinned_scorer_version_must_be_this_servers_identity():
    request = {"history": [{"text": "x"}], "request_id": "a"}
    assert parse(call({**request, "scorer_version": IDENTITY}), TEXT, IDENTITY, Limits())
    with pytest.raises(IdentityMismatch, match="is not this server's"):
        parse(call({**request, "scorer_version": "v1"}), TEXT, IDENTITY, Limits())


def requests_for(*rewards: str, count: int = 3) -> dict:
    asked = {"required_rewards": list(rewards)} if rewards else {}
    return call(
        *({"history": [{"text": "x"}], "request_id": f"r{i}", **asked} for i in range(count))
    )


def test_the_scorers_reward_is_its_terms_sum_first_and_a_failure_is_an_error_not_a_value():
    parsed = parse(requests_for(), TWO_TERMS, IDENTITY, Limits())
    assert parsed.rewards == ("judge",) and parsed.terms is None  # the scorer: every term
    nan = float("nan")
    result = ScoreResult(
        terms={"correct": [1.0, nan, 1.0], "format": [0.5, nan, nan]},
        failed={1: "the judge's reply did not parse"},
        term_failed={"format": {2: "no tags"}},
    )
    out = answer(result, parsed, TWO_TERMS)
    assert out["protocol_version"] == "1" and len(out["identities"]) == 3
    assert out["results"] == [{"judge": {"judge": 1.5, "correct": 1.0, "format": 0.5}}, {}, {}]
    assert out["errors"] == [
        {},
        {"judge": "the judge's reply did not parse"},
        {"judge": "term 'format': no tags"},
    ]


def test_named_terms_are_rewards_of_their_own_and_a_term_that_does_not_apply_has_no_value():
    """DESIGN: a term that does not apply is no value, never 0.0: asked for by name, it is the
    item's error; inside a scorer's reward it is left out of the sub-metrics, as a failed optional
    term is."""
    parsed = parse(requests_for("correct", "format", count=2), TWO_TERMS, IDENTITY, Limits())
    assert parsed.terms == ["correct", "format"]
    result = ScoreResult(
        terms={"correct": [1.0, 0.0], "format": [0.25, 9.0]}, not_applicable={"format": {1}}
    )
    out = answer(result, parsed, TWO_TERMS)
    assert out["results"] == [
        {"correct": {"correct": 1.0}, "format": {"format": 0.25}},
        {"correct": {"correct": 0.0}},
    ]
    assert out["errors"] == [
        {},
        {"format": "no term of ['format'] applies to this item's data source"},
    ]
    whole = answer(result, parse(requests_for(count=2), TWO_TERMS, IDENTITY, Limits()), TWO_TERMS)
    assert whole["results"][1] == {"judge": {"judge": 0.0, "correct": 0.0}} and whole["errors"] == [
        {},
        {},
    ]


def test_a_broken_png_is_the_clients_bad_request_not_a_scorer_error():
    whole = base64.b64decode(png(7, (16, 16)))
    # IDAT's length byte: PIL reads a broken chunk (SyntaxError)
    broken = whole[:36] + b"\x00" + whole[37:]
    request = {"history": [{"image_b64": base64.b64encode(broken).decode()}], "request_id": "a"}
    image = ScorerSpec(name="mean_intensity", input_kind="image", terms=("mean_intensity",))
    with pytest.raises(RequestError, match="is not a readable image"):
        parse(call(request), image, IDENTITY, Limits())


def test_a_served_panels_reward_is_its_weighted_reward_and_an_optional_terms_failure_leaves_it():
    parsed = parse(requests_for("panel", count=1), PANEL, IDENTITY, Limits())
    result = ScoreResult(
        terms={"correct": [1.0], "format": [float("nan")], "weighted": [1.0]},
        term_failed={"format": {0: "timeout"}},
    )
    out = answer(result, parsed, PANEL)
    assert out["results"] == [{"panel": {"panel": 1.0, "correct": 1.0}}] and out["errors"] == [{}]
