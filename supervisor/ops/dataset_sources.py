"""Where `managed-scorers score` reads its rows: JSON Lines (a file, or stdin for `-`), a JSON list
of records, Parquet, or a Hugging Face `datasets` folder written by `save_to_disk`, told apart by
the path (a folder, its extension) and, for `.json`, by its first character (`datasets`' `to_json`
writes JSON Lines under that name). Rows come one at a time (Parquet and Arrow a batch at a time),
each with its line or row number for the messages that name it; the cells are what JSON would hold
(Arrow structs as dicts, lists as lists). Parquet needs the `parquet` extra (pyarrow), a
`save_to_disk` folder the `datasets` extra: a missing one is one line naming it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from supervisor.errors import ConfigError

STDIN = Path("-")
ARROW_BATCH_ROWS = 1024  # rows converted to Python at a time: memory stays one batch, not the file


class InputRowError(ConfigError):
    """An input row cannot be read or lacks a field the panel needs (names the file and line or
    row)."""


@dataclass(frozen=True)
class Source:
    """An input and how it is read: `jsonl` (numbered by line), `json`, `parquet`, `save_to_disk`
    (by row, from 1)."""

    path: Path
    form: str

    @property
    def unit(self) -> str:
        return "line" if self.form == "jsonl" else "row"

    @property
    def base(self) -> Path:
        """The folder media paths are relative to: the file's, or (stdin) the working directory."""
        return (
            Path.cwd()
            if self.path == STDIN
            else self.path
            if self.form == "save_to_disk"
            else self.path.parent
        )

    def where(self, number: int) -> str:
        name = "<stdin>" if self.path == STDIN else str(self.path)
        return f"{name}:{number}" if self.unit == "line" else f"{name} row {number}"


def source_of(path: Path) -> Source:
    """How `path` is read (refused in one line when it is none of the forms, or missing)."""
    if path == STDIN:
        return Source(path, "jsonl")
    if path.is_dir():
        if (path / "dataset_dict.json").is_file():
            splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
            raise ConfigError(
                f"{path} holds a DatasetDict ({', '.join(map(str, splits))}): give one "
                f"split's folder, e.g. --input {path / (splits[0] if splits else 'train')}"
            )
        if not (path / "state.json").is_file():
            raise ConfigError(
                f"{path} is a folder, not a dataset saved with save_to_disk (it has no state.json)"
            )
        return Source(path, "save_to_disk")
    if not path.is_file():
        raise ConfigError(f"--input {path}: no such file")
    if path.suffix == ".parquet":
        return Source(path, "parquet")
    if path.suffix == ".json" and _first_character(path) == "[":
        return Source(path, "json")
    return Source(path, "jsonl")


def _first_character(path: Path) -> str:
    with open(path, "rb") as handle:
        return handle.read(4096).lstrip()[:1].decode("ascii", "replace")


def records(source: Source) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """(number, the row's cells) for each row, in order; None for a blank JSONL line."""
    if source.form == "jsonl":
        if source.path == STDIN:
            yield from _lines(sys.stdin.buffer, source)
        else:
            with open(source.path, "rb") as handle:
                yield from _lines(handle, source)
    elif source.form == "json":
        yield from _json_list(source)
    elif source.form == "parquet":
        yield from _parquet(source)
    else:
        yield from _saved_dataset(source)


def _lines(handle: IO[bytes], source: Source) -> Iterator[tuple[int, dict[str, Any] | None]]:
    for number, encoded in enumerate(handle, start=1):
        yield number, _decoded(encoded, source.where(number))


def _decoded(encoded: bytes, where: str) -> dict[str, Any] | None:
    """One line's JSON object (None for a blank line)."""
    try:
        raw = encoded.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputRowError(f"{where}: not UTF-8 (byte {exc.start + 1}: {exc.reason})") from exc
    if not raw.strip():
        return None
    return _object(_parsed(raw, where), where)


def _parsed(raw: str, where: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        at = f"line {exc.lineno} " if exc.lineno > 1 else ""
        raise InputRowError(f"{where}: not JSON ({exc.msg} at {at}column {exc.colno})") from exc
    # a 5,000-digit number; brackets nested 100,000 deep
    except (ValueError, RecursionError) as exc:
        raise InputRowError(
            f"{where}: not readable JSON ({type(exc).__name__}: {str(exc)[:120]})"
        ) from exc


def _object(fields: Any, where: str) -> dict[str, Any]:
    if not isinstance(fields, dict):
        raise InputRowError(f"{where}: a row must be a JSON object, got {type(fields).__name__}")
    return fields


def _json_list(source: Source) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """A JSON array of objects: parsed whole (the stdlib has no streaming parse), then row by
    row."""
    try:
        text = source.path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputRowError(
            f"{source.path}: not UTF-8 (byte {exc.start + 1}: {exc.reason})"
        ) from exc
    rows = _parsed(text, str(source.path))
    if not isinstance(rows, list):
        raise InputRowError(
            f"{source.path}: a JSON input must be a list of records, got {type(rows).__name__}"
        )
    for number, fields in enumerate(rows, start=1):
        yield number, _object(fields, source.where(number))


def _parquet(source: Source) -> Iterator[tuple[int, dict[str, Any] | None]]:
    needs_extra("parquet", "pyarrow", f"--input {source.path} (Parquet)")
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        batches = pq.ParquetFile(source.path).iter_batches(batch_size=ARROW_BATCH_ROWS)
        number = 0
        for batch in batches:
            for fields in batch.to_pylist():
                number += 1
                yield number, fields
    except (pa.ArrowException, OSError) as exc:
        raise InputRowError(
            f"{source.path}: not a readable Parquet file ({type(exc).__name__}: {exc})"
        ) from exc


def _saved_dataset(source: Source) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """The rows of a `save_to_disk` folder as Arrow holds them (an image feature stays its stored
    {bytes, path}: nothing is decoded), read a batch at a time from the memory-mapped files."""
    needs_extra("datasets", "datasets", f"--input {source.path} (a save_to_disk folder)")
    import datasets

    try:
        dataset = datasets.load_from_disk(str(source.path))
    except (OSError, ValueError) as exc:
        raise InputRowError(
            f"{source.path}: not a readable save_to_disk folder ({type(exc).__name__}: {exc})"
        ) from exc
    number = 0
    for batch in dataset.with_format("arrow").iter(batch_size=ARROW_BATCH_ROWS):
        for fields in batch.to_pylist():
            number += 1
            yield number, fields


def needs_extra(extra: str, module: str, what: str) -> None:
    from scorers import install

    missing = install.missing_extra(extra, what, (module,))
    if missing is not None:
        raise ConfigError(missing)
