"""An item's fields, declared once: their order on the wire, their kind, which are left out when
empty, the media's dtype and layout, and the defaults.

Why here: every view of an item reads this one list, so they cannot drift apart. The child's
protocol (`child_runtime.protocol.items`: WIRE_FIELDS, MEDIA_FIELDS, OMITTED_WHEN_EMPTY,
MEDIA_LAYOUTS) and the trainer's `RewardItem.to_wire` derive from it; the explicit classes that type
checkers and pickling need (`scorers.base.ScoreItem`, `supervisor.types.RewardItem`) are held to it
by tests/contract/test_item_fields.py. It sits on the lowest floor all of them may import, beside
the scorer contract, and is stdlib only (a text scorer's child imports no numpy for it). Adding a
field is one entry here plus the code that gives it meaning: its type on both classes and its check
on the wire (`items.item_from_wire`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TEXT = "text"  # a string or null
INT = "int"  # an int or null
JSON = "json"  # any JSON value
ARRAY = "array"  # one array: it travels in the wire's array frames, never as JSON
ARRAYS = "arrays"  # a list of arrays, nested per item (conditioning media)
MEDIA_KINDS = (ARRAY, ARRAYS)


@dataclass(frozen=True)
class ItemField:
    """One field of an item. `layout` names an array's axes (for ARRAYS, each array's)."""

    name: str
    kind: str
    required: bool = False  # no default: every item gives it
    default: Any = None
    # a fresh mutable default per item ({}), else `default`
    default_factory: Callable[[], Any] | None = None
    omitted_when_empty: bool = False  # {} or (): not sent
    dtype: str = ""  # an array's element type
    layout: str = ""

    def empty(self) -> Any:
        """This field's value on an item that does not give it."""
        return self.default_factory() if self.default_factory is not None else self.default


FIELDS = (
    ItemField("id", TEXT, required=True),
    ItemField("group_id", TEXT),
    ItemField("prompt", TEXT),
    ItemField("text", TEXT),
    ItemField("image", ARRAY, dtype="uint8", layout="HWC"),
    ItemField("video", ARRAY, dtype="uint8", layout="THWC"),
    ItemField("reference", JSON),
    ItemField("metadata", JSON, default_factory=dict, omitted_when_empty=True),
    ItemField("finish_reason", TEXT),
    ItemField("completion_tokens", INT),
    ItemField("data_source", TEXT),
    ItemField(
        "condition_images", ARRAYS, default=(), omitted_when_empty=True, dtype="uint8", layout="HWC"
    ),
    ItemField(
        "condition_videos",
        ARRAYS,
        default=(),
        omitted_when_empty=True,
        dtype="uint8",
        layout="THWC",
    ),
    ItemField("audio", ARRAY, dtype="float32", layout="CS"),  # (channels, samples)
    ItemField("audio_sample_rate", INT),  # Hz; set exactly when audio is
)
NAMES = tuple(field.name for field in FIELDS)  # the wire's order
BY_NAME = {field.name: field for field in FIELDS}
MEDIA = tuple(field.name for field in FIELDS if field.kind in MEDIA_KINDS)  # arrays: never JSON
OMITTED_WHEN_EMPTY = tuple(field.name for field in FIELDS if field.omitted_when_empty)
