"""Request validation shared by the child and the local backend: every violation names its field."""

from __future__ import annotations

import re

import numpy as np
import pytest

from child_runtime.protocol.items import RequestError, items_from_wire, response_to_wire
from child_runtime.protocol.wire import decode, encode
from scorers.base import ScoreItem, ScoreResult


def req(*items: dict, **extra) -> dict:
    return {"items": list(items), **extra}


def raises(match: str):
    return pytest.raises(RequestError, match=re.escape(match))


def test_valid_request_builds_score_items_in_order():
    image = np.zeros((4, 5, 3), dtype=np.uint8)
    video = np.ones((2, 4, 5, 4), dtype=np.uint8)
    items = items_from_wire(
        req(
            {
                "id": "a",
                "group_id": "g",
                "prompt": "p",
                "text": "t",
                "image": image,
                "reference": {"answer": "42"},
                "metadata": {"k": [1, 2]},
            },
            {"id": "b", "video": video},
            {"id": "c", "text": None, "prompt": None, "group_id": None, "image": None},
        )
    )
    assert [type(i) for i in items] == [ScoreItem] * 3
    assert [i.id for i in items] == ["a", "b", "c"]
    a, b, c = items
    assert (a.group_id, a.prompt, a.text, a.reference, a.metadata) == (
        "g",
        "p",
        "t",
        {"answer": "42"},
        {"k": [1, 2]},
    )
    # a read-only view, not a copy
    assert np.shares_memory(a.image, image) and not a.image.flags.writeable
    assert np.shares_memory(b.video, video) and not b.video.flags.writeable
    assert image.flags.writeable  # the caller's own array is untouched
    assert b.image is None and b.text is None and b.metadata == {} and b.reference is None
    assert (c.text, c.prompt, c.group_id, c.image, c.metadata) == (None, None, None, None, {})


def test_valid_request_after_a_wire_round_trip():
    image = np.arange(2 * 3 * 1, dtype=np.uint8).reshape(2, 3, 1)
    items = items_from_wire(decode(encode(req({"id": "x", "image": image, "text": "hi"}))))
    assert items[0].id == "x" and items[0].text == "hi"
    assert items[0].image.shape == (2, 3, 1) and items[0].image.tolist() == image.tolist()


@pytest.mark.parametrize(
    "meta", [None, [], "items", {"itemz": []}], ids=["null", "list", "str", "no-items"]
)
def test_request_must_be_object_with_items(meta):
    with raises("request must be an object with an 'items' list"):
        items_from_wire(meta)


def test_unknown_request_field():
    with raises("request has unknown fields ['batch', 'extra']"):
        items_from_wire(req({"id": "a"}, extra=1, batch=2))


@pytest.mark.parametrize(
    "value", [[], None, {"id": "a"}, "a"], ids=["empty", "null", "object", "str"]
)
def test_items_must_be_a_non_empty_list(value):
    with raises("request.items must be a non-empty list"):
        items_from_wire({"items": value})


@pytest.mark.parametrize("raw", [None, "a", ["a"], 3], ids=["null", "str", "list", "int"])
def test_item_must_be_an_object(raw):
    with raises("items[1] must be an object"):
        items_from_wire(req({"id": "a"}, raw))


@pytest.mark.parametrize(
    "item",
    [{"text": "no id"}, {"id": ""}, {"id": None}, {"id": 7}, {"id": ["a"]}],
    ids=["missing", "empty", "null", "int", "list"],
)
def test_id_must_be_a_non_empty_string(item):
    with raises("items[1].id must be a non-empty string"):
        items_from_wire(req({"id": "ok"}, item))


def test_duplicate_ids_name_both_positions():
    with raises("items[3].id 'b' duplicates items[1].id"):
        items_from_wire(req({"id": "a"}, {"id": "b"}, {"id": "c"}, {"id": "b"}))


@pytest.mark.parametrize("field", ["prompt", "text", "group_id"])
@pytest.mark.parametrize(
    "value,type_name", [(1, "int"), (["x"], "list"), ({"a": 1}, "dict"), (True, "bool")]
)
def test_non_string_text_fields(field, value, type_name):
    with raises(f"items[1].{field} must be a string or null, got {type_name}"):
        items_from_wire(req({"id": "a"}, {"id": "b", field: value}))


def test_unknown_item_field_is_named():
    with raises("items[2] has unknown fields ['component_rewards', 'reward']"):
        items_from_wire(
            req({"id": "a"}, {"id": "b"}, {"id": "c", "reward": 1.0, "component_rewards": {}})
        )


@pytest.mark.parametrize(
    "image,desc",
    [
        (np.zeros((4, 4, 3), dtype=np.float32), "float32 [4, 4, 3]"),
        (np.zeros((4, 4, 3), dtype=np.int8), "int8 [4, 4, 3]"),
        (np.zeros((4, 4), dtype=np.uint8), "uint8 [4, 4]"),
        (np.zeros((1, 2, 4, 4, 3), dtype=np.uint8), "uint8 [1, 2, 4, 4, 3]"),
        (np.zeros((4, 4, 2), dtype=np.uint8), "uint8 [4, 4, 2]"),
        (np.zeros((2, 4, 4, 3), dtype=np.uint8), "uint8 [2, 4, 4, 3]"),
        (np.zeros((3,), dtype=np.uint8), "uint8 [3]"),
    ],
    ids=["float32", "int8", "2d", "5d", "2-channels", "video-as-image", "1d"],
)
def test_bad_image_array(image, desc):
    with raises(f"items[1].image must be uint8 HWC with 1, 3 or 4 channels, got {desc}"):
        items_from_wire(req({"id": "a"}, {"id": "b", "image": image}))


@pytest.mark.parametrize(
    "video,desc",
    [
        (np.zeros((4, 4, 3), dtype=np.uint8), "uint8 [4, 4, 3]"),
        (np.zeros((2, 4, 4, 5), dtype=np.uint8), "uint8 [2, 4, 4, 5]"),
        (np.zeros((2, 4, 4, 3), dtype=np.float32), "float32 [2, 4, 4, 3]"),
    ],
    ids=["image-as-video", "5-channels", "float32"],
)
def test_bad_video_array(video, desc):
    with raises(f"items[0].video must be uint8 THWC with 1, 3 or 4 channels, got {desc}"):
        items_from_wire(req({"id": "a", "video": video}))


@pytest.mark.parametrize("image,type_name", [([[1, 2]], "list"), ("png", "str"), (3, "int")])
def test_image_must_be_an_array(image, type_name):
    with raises(f"items[0].image must be an array, got {type_name}"):
        items_from_wire(req({"id": "a", "image": image}))


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_image_channel_counts_accepted(channels):
    items = items_from_wire(req({"id": "a", "image": np.zeros((2, 2, channels), dtype=np.uint8)}))
    assert items[0].image.shape == (2, 2, channels)


@pytest.mark.parametrize("metadata", [[1], "x", 3, True], ids=["list", "str", "int", "bool"])
def test_metadata_must_be_an_object(metadata):
    with raises("items[1].metadata must be an object"):
        items_from_wire(req({"id": "a"}, {"id": "b", "metadata": metadata}))


@pytest.mark.parametrize(
    "metadata", [[], "", 0, False], ids=["empty-list", "empty-str", "zero", "false"]
)
def test_falsy_non_object_metadata_is_rejected_too(metadata):
    with raises("items[0].metadata must be an object"):
        items_from_wire(req({"id": "a", "metadata": metadata}))


def test_first_violation_in_item_order_is_reported():
    with raises("items[0].text must be a string or null"):
        items_from_wire(req({"id": "a", "text": 1}, {"id": ""}))


def test_response_to_wire_echoes_ids_and_float64_terms():
    items = [ScoreItem(id="a"), ScoreItem(id="b")]
    wire = response_to_wire(items, ScoreResult(terms={"t": [1, 2.5]}, diagnostics={"n": 2}))
    assert wire["ids"] == ["a", "b"]
    # a stdlib float64 array: a text scorer's child never imports numpy
    assert wire["terms"]["t"].typecode == "d" and wire["terms"]["t"].tolist() == [1.0, 2.5]
    assert wire["diagnostics"] == {"n": 2}
    back = decode(encode(wire))  # the same bytes as a float64 ndarray's
    assert back["terms"]["t"].dtype == np.float64 and back["terms"]["t"].tolist() == [1.0, 2.5]
    assert back["ids"] == ["a", "b"]
    assert encode(wire) == encode({**wire, "terms": {"t": np.array([1.0, 2.5])}})
