"""Every view of an item agrees with its one declaration (scorers.item_fields): the scorer's
ScoreItem, the trainer's RewardItem and its to_wire, the wire's field sets, the decoder, and the
places that map other protocols' fields onto an item's. A field added to one view only fails
here."""

from __future__ import annotations

import base64
import dataclasses
import io
from typing import Any

import numpy as np
import pytest
from PIL import Image

from child_runtime.protocol import items as wire_items
from child_runtime.protocol import openrlhf, unirl
from child_runtime.protocol.wire import decode, encode
from scorers import base, groups, item_fields
from scorers.base import ScoreItem, ScorerSpec
from scorers.ff import inputs as ff_inputs
from scorers.item_fields import ARRAY, ARRAYS, FIELDS, INT, JSON, NAMES, TEXT, ItemField
from supervisor.compose.distributed import JSON_FIELDS
from supervisor.ops import precheck
from supervisor.ops.panel_scorer import reward_item
from supervisor.types import TRAINER_FIELDS, RewardItem

AXES = {"T": 2, "H": 2, "W": 3, "S": 4}  # C: 3 pixel channels, 1 audio channel


def sample(field: ItemField) -> Any:
    """A value of the field's kind that is not its default (a new kind needs a sample here)."""
    if field.kind in (ARRAY, ARRAYS):
        shape = tuple(AXES.get(axis, 3 if field.dtype == "uint8" else 1) for axis in field.layout)
        array = np.full(shape, 0.5 if field.dtype == "float32" else 7, dtype=field.dtype)
        return array if field.kind == ARRAY else (array,)
    return {TEXT: f"{field.name}-value", INT: 16000, JSON: {"key": "value"}}[field.kind]


def full_item() -> RewardItem:
    return RewardItem(**{field.name: sample(field) for field in FIELDS})


def same(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) or isinstance(b, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and np.array_equal(a, b)
        )
    return bool(a == b)


def test_the_declaration_is_well_formed():
    assert len(set(NAMES)) == len(NAMES)
    assert [field.name for field in FIELDS if field.required] == ["id"] == [NAMES[0]]
    for field in FIELDS:
        media = field.kind in (ARRAY, ARRAYS)
        assert field.kind in (TEXT, INT, JSON, ARRAY, ARRAYS), field
        assert bool(field.dtype) == bool(field.layout) == media, field
        assert not field.omitted_when_empty or field.empty() in ({}, ()), field
    assert item_fields.BY_NAME == {field.name: field for field in FIELDS}


def test_score_item_has_the_declared_fields_in_order_with_their_defaults():
    fields = dataclasses.fields(ScoreItem)
    assert [field.name for field in fields] == list(NAMES)
    for field, declared in zip(fields, FIELDS, strict=True):
        if declared.required:
            assert (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            )
        elif declared.default_factory is not None:
            assert field.default_factory is declared.default_factory, field.name
        else:
            assert (
                field.default_factory is dataclasses.MISSING and field.default == declared.default
            ), field.name
    bare = ScoreItem(id="x")
    assert all(same(getattr(bare, field.name), field.empty()) for field in FIELDS[1:])


def test_reward_item_has_the_declared_fields_in_order_then_the_trainers_own():
    assert list(RewardItem.model_fields) == [*NAMES, *TRAINER_FIELDS]
    for declared in FIELDS:
        info = RewardItem.model_fields[declared.name]
        assert info.is_required() == declared.required, declared.name
        if not declared.required:
            assert same(info.get_default(call_default_factory=True), declared.empty()), (
                declared.name
            )
    bare = RewardItem(id="x")
    assert all(same(getattr(bare, field.name), field.empty()) for field in FIELDS[1:])


def test_the_wire_field_sets_are_the_declarations():
    assert wire_items.WIRE_FIELDS == NAMES
    assert wire_items.ITEM_FIELDS == set(NAMES)
    assert wire_items.MEDIA_FIELDS == {
        field.name for field in FIELDS if field.kind in (ARRAY, ARRAYS)
    }
    assert wire_items.OMITTED_WHEN_EMPTY == {
        field.name for field in FIELDS if field.omitted_when_empty
    }
    pixels = {
        field.name: field.layout
        for field in FIELDS
        if field.kind == ARRAY and field.dtype == "uint8"
    }
    assert wire_items.MEDIA_LAYOUTS == pixels == {"image": "HWC", "video": "THWC"}
    assert JSON_FIELDS == tuple(name for name in NAMES if name not in wire_items.MEDIA_FIELDS)


def test_to_wire_writes_every_declared_field_in_order_and_leaves_out_the_empty():
    full = full_item()
    wire = full.to_wire()
    assert list(wire) == list(NAMES)
    assert full.has_media
    assert list(RewardItem(id="x", metadata={}, condition_images=[]).to_wire()) == ["id"]


@pytest.mark.parametrize("framed", [False, True], ids=["in-process", "framed"])
def test_every_declared_field_survives_the_wire_and_the_panels_way_back(framed):
    """The decoder builds each field (none accepted and then dropped), and a served panel rebuilds
    it."""
    full = full_item()
    meta = {"items": [full.to_wire()]}
    [decoded] = wire_items.items_from_wire(decode(encode(meta)) if framed else meta)
    for name in NAMES:
        assert same(getattr(decoded, name), getattr(full, name)), name
    back = reward_item(decoded)
    for name in NAMES:
        assert same(getattr(back, name), getattr(full, name)), name


def _png() -> str:
    buffer = io.BytesIO()
    Image.fromarray(np.full((4, 5, 3), 9, np.uint8)).save(buffer, "PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_the_json_protocols_map_onto_declared_fields():
    spec = ScorerSpec(name="exact_match", input_kind="text")
    text = {
        "history": [{"text": "p"}, {"text": "t"}],
        "request_id": "a",
        "metadata": {"reference": "r"},
    }
    image = {
        "history": [{"image_b64": _png()}, {"text": "p", "image_b64": _png()}],
        "request_id": "b",
    }
    parsed = unirl.parse(
        {"protocol_version": "1", "requests": [text, image]}, spec, "id", wire_items.Limits()
    )
    openrlhf_request = openrlhf.wire_request([openrlhf.Sample("p", "t", "r")])
    for request in (parsed.wire, openrlhf_request):
        assert all(set(item) <= set(NAMES) for item in request["items"])
        wire_items.items_from_wire(request)


def test_the_field_lists_of_other_places_name_declared_fields():
    assert ff_inputs.MEDIA_FIELDS == item_fields.MEDIA
    assert set(ff_inputs.FIELDS) <= set(NAMES)
    assert {*precheck.TEXT_FIELDS, *precheck.MEDIA_FIELDS, *precheck.COMPLETION.values()} <= set(
        NAMES
    )
    assert {name for names in base._COMPLETION_FIELDS.values() for name in names} <= set(NAMES)
    assert set(groups.COMMON_INPUTS) <= set(NAMES)
