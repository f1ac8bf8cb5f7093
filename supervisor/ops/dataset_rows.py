"""The input of `managed-scorers score`: rows (from any form `dataset_sources` reads) checked before
anything is scored or started (unique ids, the needed fields, valid items, images that open and WAVs
whose every frame reads, groups contiguous and whole), each with a digest of its content; and the
RewardItems made of them, a row whose media do not decode then failing alone. Columns may name
nested cells by dotted path, and prompts and completions may be chat messages (`dataset_cells`).
"""

from __future__ import annotations

import hashlib
import io
import json
import reprlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scorers.groups import COMMON_INPUTS, NotContiguous, contiguous_runs, strict_key
from supervisor.errors import validation_message
from supervisor.ops.dataset_cells import NoText, cell, text_of
from supervisor.ops.dataset_presets import PRESETS
from supervisor.ops.dataset_sources import InputRowError, Source, records
from supervisor.ops.wav import WavError, check_wav, read_wav
from supervisor.types import RewardItem

SHOWN = reprlib.Repr()  # Python 3.11's takes no keywords
SHOWN.maxstring = SHOWN.maxother = 80
SHOWN.maxlevel, SHOWN.maxdict, SHOWN.maxlist = 2, 4, 4

__all__ = ["Columns", "InputRowError", "Row", "group_of", "items_of", "read_rows"]


@dataclass(frozen=True)
class Columns:
    """Which input fields hold what, each a column name or a dotted path into nested records.
    `image` and `audio` hold a path (relative to the input file's folder): an image PIL opens, a PCM
    WAV (supervisor.ops.wav)."""

    id: str = "id"
    prompt: str = "prompt"
    response: str = "response"
    reference: str = "reference"
    image: str | None = None
    group: str | None = None
    data_source: str = "data_source"
    audio: str | None = None

    def record(self) -> dict[str, Any]:
        """As an output's header names them; no audio column is left out, so an output written
        before there was one still resumes."""
        return {
            key: value
            for key, value in asdict(self).items()
            if not (key == "audio" and value is None)
        }


def columns_for(preset: str | None, **given: str | None) -> Columns:
    """Today's defaults, then the preset's names, then each column given explicitly."""
    chosen = {
        **(PRESETS[preset] if preset is not None else {}),
        **{k: v for k, v in given.items() if v is not None},
    }
    return Columns(**chosen)


@dataclass(frozen=True)
class Row:
    line: int
    id: str
    fields: dict[str, Any]
    digest: str  # of the whole input row: a resumed output must have been made from this very row
    unit: str = "line"  # what `line` counts: lines (JSONL) or rows (the other forms)


def read_rows(
    source: Source, columns: Columns, needs_text: bool, group_size: int | None = None
) -> list[Row]:
    """Every row, checked before anything is scored or started: readable records, unique ids, the
    needed fields, a valid item (types, finite numbers), images that open, groups contiguous, of
    `group_size` when one is declared, and sharing their prompt, reference and data source."""
    rows: list[Row] = []
    seen: dict[str, int] = {}
    for number, fields in records(source):
        if fields is None:
            continue
        where = source.where(number)
        row_id = _row_id(fields, columns, f"{source.unit}-{number}", where)
        row = Row(number, row_id, _read_by(fields, columns), _digest(fields), source.unit)
        if row.id in seen:
            raise InputRowError(
                f"{where}: id {row.id!r} was already used on {source.unit} {seen[row.id]}"
            )
        seen[row.id] = number
        _check_fields(row, columns, needs_text, source.base, where)
        rows.append(row)
    if columns.group is not None:
        _check_contiguous(source, rows, columns)
        _check_groups(source, rows, columns, group_size)
    return rows


def _read_by(fields: dict[str, Any], columns: Columns) -> dict[str, Any]:
    """Only the fields the columns read (a dotted path's top key too): the rest of a row (a verl
    parquet's extra_info, long unused texts) is in its digest, not held for the whole run."""
    paths = [path for path in asdict(columns).values() if path]
    wanted = {*paths, *(path.split(".")[0] for path in paths)}
    return {key: value for key, value in fields.items() if key in wanted}


def _shown(value: Any) -> str:
    """A cell as an error line quotes it: its repr, cut short (an image's bytes would be
    megabytes)."""
    return SHOWN.repr(value)


def _digest(fields: dict[str, Any]) -> str:
    """The row's content digest: its canonical JSON (scorers.identity), with what JSON cannot hold
    (a Parquet row's bytes, timestamps, decimals) by the hash of its bytes or its repr."""
    canonical = json.dumps(
        fields,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=True,
        default=_stand_in,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _stand_in(value: Any) -> str:
    return f"bytes:{hashlib.sha256(value).hexdigest()}" if isinstance(value, bytes) else repr(value)


def _row_id(fields: dict[str, Any], columns: Columns, default: str, where: str) -> str:
    row_id = cell(fields, columns.id)
    if row_id is None and columns.id not in fields:
        row_id = default
    if not isinstance(row_id, (str, int)) or isinstance(row_id, bool):
        raise InputRowError(
            f"{where}: {columns.id!r} must be a string or an integer, got {_shown(row_id)}"
        )
    return str(row_id)


def _check_fields(row: Row, columns: Columns, needs_text: bool, base: Path, where: str) -> None:
    """The row's own fields: text, image, group key, and a valid item (types, finite numbers), its
    audio standing in as a waveform of the file's channels and rate: what the item checks of it is
    checked now."""
    fields = row.fields
    try:
        texts = _texts(row, columns)
    except NoText as exc:
        raise InputRowError(f"{where}: {exc}") from exc
    if needs_text and not isinstance(texts["text"], str):
        raise InputRowError(f"{where}: no text in column {columns.response!r} (--response-column)")
    if columns.image is not None:
        _check_image(cell(fields, columns.image), base, columns.image, where)
    audio = (
        {}
        if columns.audio is None
        else _check_audio(cell(fields, columns.audio), base, columns.audio, where)
    )
    if columns.group is not None:
        group = cell(fields, columns.group)
        if not isinstance(group, (str, int)) or isinstance(group, bool):
            raise InputRowError(
                f"{where}: column {columns.group!r} must hold a group (string or integer)"
            )
    try:
        _item(row, columns, **audio)
    # pydantic's ValidationError: a type, an empty id, a NaN, audio it refuses
    except ValueError as exc:
        raise InputRowError(f"{where}: {validation_message(exc)}") from exc


def _check_contiguous(source: Source, rows: Sequence[Row], columns: Columns) -> None:
    try:
        contiguous_runs([group_of(row, columns) for row in rows])
    except NotContiguous as exc:
        raise InputRowError(
            f"{source.where(rows[exc.position].line)}: group {exc.group!r} began on {source.unit} "
            f"{rows[exc.started].line}: groups must be contiguous"
        ) from exc


def _check_groups(
    source: Source, rows: Sequence[Row], columns: Columns, group_size: int | None
) -> None:
    """Each group of `group_size` rows (when declared), whose prompt, reference and data source are
    the same (type-strictly): what the scorers would refuse after boot, named by line before it."""
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(group_of(row, columns) or "", []).append(row)
    names = {
        "prompt": columns.prompt,
        "reference": columns.reference,
        "data_source": columns.data_source,
    }
    for group, members in groups.items():
        if group_size is not None and len(members) != group_size:
            raise InputRowError(
                f"{source.where(members[0].line)}: group {group!r} has {len(members)} rows "
                f"({source.unit}s {', '.join(str(r.line) for r in members[:8])}), the "
                f"recipe's group_size is {group_size}"
            )
        for common in COMMON_INPUTS:
            column = names[common]
            expected = strict_key(cell(members[0].fields, column))
            for row in members[1:]:
                if strict_key(cell(row.fields, column)) != expected:
                    raise InputRowError(
                        f"{source.where(row.line)}: column {column!r} differs from "
                        f"{source.unit} {members[0].line}, "
                        "the first of "
                        f"group {group!r}: the rows of a group share their {common} (a "
                        f"missing one differs too)"
                    )


def _image_file(value: Any, base: Path) -> Path | io.BytesIO | None:
    """Where an image cell's bytes are: a file path (relative to the input's folder), or a Hugging
    Face `datasets` Image cell (`{bytes, path}`: its bytes, else its file); None when it names
    neither."""
    if isinstance(value, dict):
        if isinstance(value.get("bytes"), bytes):
            return io.BytesIO(value["bytes"])
        value = value.get("path")
    return base / value if isinstance(value, str) and _is_file(base / value) else None


def _is_file(path: Path) -> bool:
    """Whether a cell names a file; a name no file can have (too long, a NUL in it) names none."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def _check_image(value: Any, base: Path, column: str, where: str) -> None:
    from PIL import Image, UnidentifiedImageError

    image = _image_file(value, base)
    if image is None:
        raise InputRowError(
            f"{where}: column {column!r} must name an image file or hold a datasets Image, "
            f"got {_shown(value)}"
        )
    try:
        # the header only: a file that is not an image fails here, not mid-run
        with Image.open(image):
            pass
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
        named = value if isinstance(value, str) else f"column {column!r}'s image"
        raise InputRowError(
            f"{where}: {named} is not a readable image ({type(exc).__name__}: {exc})"
        ) from exc


def _check_audio(value: Any, base: Path, column: str, where: str) -> dict[str, Any]:
    """A WAV whose every frame reads as a waveform (`wav.check_wav`: a file that is not one fails
    here, not mid-run), and the item's audio fields standing in for it: one silent sample of its
    channels, its rate."""
    if not isinstance(value, str) or not _is_file(base / value):
        raise InputRowError(f"{where}: column {column!r} must name a WAV file, got {_shown(value)}")
    try:
        header = check_wav(base / value)
    except WavError as exc:
        raise InputRowError(f"{where}: {exc}") from exc
    return {"audio": np.zeros((header.channels, 1), np.float32), "audio_sample_rate": header.rate}


def _decoded_image(row: Row, columns: Columns, base: Path) -> np.ndarray | None:
    """The row's image as RGB pixels (OSError, SyntaxError or DecompressionBombError: it does not
    decode)."""
    if columns.image is None:
        return None
    from PIL import Image

    image = _image_file(cell(row.fields, columns.image), base)
    if image is None:  # it was there when the rows were checked
        raise FileNotFoundError(f"the image of column {columns.image!r} is gone")
    with Image.open(image) as opened:
        return np.asarray(opened.convert("RGB"))


def _decoded_audio(row: Row, columns: Columns, base: Path) -> dict[str, Any]:
    """The row's audio and its rate as RewardItem fields (WavError: it does not decode)."""
    if columns.audio is None:
        return {}
    audio, rate = read_wav(base / cell(row.fields, columns.audio))
    return {"audio": audio, "audio_sample_rate": rate}


def _texts(row: Row, columns: Columns) -> dict[str, Any]:
    """The row's prompt and text as an item takes them (NoText: a cell holds messages with no
    text)."""
    fields = row.fields
    try:
        prompt = text_of(cell(fields, columns.prompt), completion=False)
    except NoText as exc:
        raise NoText(f"column {columns.prompt!r} {exc} (--prompt-column)") from exc
    try:
        text = text_of(cell(fields, columns.response), completion=True)
    except NoText as exc:
        raise NoText(f"column {columns.response!r} {exc} (--response-column)") from exc
    return {"prompt": prompt, "text": text}


def _item(row: Row, columns: Columns, image: np.ndarray | None = None, **audio: Any) -> RewardItem:
    fields = row.fields
    return RewardItem(
        id=row.id,
        **_texts(row, columns),
        image=image,
        **audio,
        reference=cell(fields, columns.reference),
        group_id=group_of(row, columns),
        data_source=cell(fields, columns.data_source),
    )


def items_of(
    batch: Sequence[Row], columns: Columns, input_dir: Path
) -> tuple[list[RewardItem], dict[str, str]]:
    """The batch's items, and why each row that cannot become one failed: an image or a WAV that
    passed the check but does not decode (changed since, corrupt), or whose decoded media its item
    refuses. Such a row gets that error and takes its whole group with it; the run goes on."""
    items, unreadable, broken = [], {}, set()
    for row in batch:
        try:
            items.append(_decoded_item(row, columns, input_dir))
        except UndecodedRow as exc:
            unreadable[row.id] = f"input {row.unit} {row.line}: {exc}"
            broken.add(group_of(row, columns))
    broken.discard(None)
    for row in batch:
        if row.id not in unreadable and group_of(row, columns) in broken:
            unreadable[row.id] = (
                f"input {row.unit} {row.line}: a member of its group has media that cannot "
                f"be decoded"
            )
    return [item for item in items if item.id not in unreadable], unreadable


class UndecodedRow(ValueError):
    """A row's media did not decode, or its item refused them: that row's error, never the run's."""


def _decoded_item(row: Row, columns: Columns, base: Path) -> RewardItem:
    try:
        audio = _decoded_audio(row, columns, base)
    except WavError as exc:
        raise UndecodedRow(f"cannot decode its audio ({exc})") from exc
    try:
        image = _decoded_image(row, columns, base)
    except Exception as exc:  # noqa: BLE001 - whatever the decoder raises (OSError cut short, SyntaxError, ValueError, zlib.error, DecompressionBombError...) is this row's input fault
        raise UndecodedRow(f"cannot decode its image ({type(exc).__name__}: {exc})") from exc
    try:
        return _item(row, columns, image, **audio)
    # pydantic's ValidationError: the decoded media are not what an item takes
    except ValueError as exc:
        raise UndecodedRow(f"its decoded media are refused ({validation_message(exc)})") from exc


def group_of(row: Row, columns: Columns) -> str | None:
    return None if columns.group is None else str(cell(row.fields, columns.group))
