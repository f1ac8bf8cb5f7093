"""Score a JSONL dataset through a panel: one output row per input row, in input order, resumable.

The output starts with a header line (the panel's identity hash and each term's scorer and
revision); every other line is one input row's result: `id`, `reward`, `components`, `error`.
Rows are written a whole batch at a time, flushed, so an interrupted run (Ctrl-C, a kill)
leaves a valid prefix; `resume` keeps it, drops a torn last line, and scores only the ids not
yet written, refusing an output made by another identity (a changed revision, params or
weights). Malformed input fails before anything is scored, naming the file and line. A batch
the scorer refuses is split until the refused rows are isolated: each gets `reward: null` and
its error, never a reward; if every row of a batch fails on its own, the run stops instead.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from scorers.diagnostics import merge_term_reports, to_metrics
from supervisor.errors import ConfigError, ScorerRequestError
from supervisor.overlap import micro_batches
from supervisor.panel import RewardPanel
from supervisor.types import RewardItem, RewardRequest

HEADER_KEY = "managed_scorers_output"
FORMAT_VERSION = 1
PER_ROW_KINDS = ("bad_input", "scorer_error")  # what a row can cause; anything else stops the run


class InputRowError(ConfigError):
    """An input row cannot be read or lacks a field the panel needs (names the file and line)."""


class ResumeRefused(ConfigError):
    """The output file was written by another scorer identity, or is not a managed-scorers output."""


@dataclass(frozen=True)
class Columns:
    """Which input fields hold what. `image` holds a path (relative to the input file's folder)."""

    id: str = "id"
    prompt: str = "prompt"
    response: str = "response"
    reference: str = "reference"
    image: str | None = None
    group: str | None = None
    data_source: str = "data_source"


@dataclass(frozen=True)
class Row:
    line: int
    id: str
    fields: dict[str, Any]


@dataclass
class Summary:
    total: int
    skipped: int  # already in the output (resume)
    scored: int = 0
    errors: int = 0
    reward_sum: float = 0.0
    diagnostics: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def line(self) -> str:
        ok = self.scored - self.errors
        mean = f"{self.reward_sum / ok:.4f}" if ok else "-"
        return (
            f"{self.scored} rows scored ({self.errors} with errors), {self.skipped} already done, "
            f"mean reward {mean}, {self.seconds:.1f} s"
        )


def read_rows(path: Path, columns: Columns, needs_text: bool) -> list[Row]:
    """Every row, checked before anything is scored: JSON objects, unique ids, the needed fields."""
    rows: list[Row] = []
    seen: dict[str, int] = {}
    with open(path, encoding="utf-8") as handle:
        for number, raw in enumerate(handle, start=1):
            where = f"{path}:{number}"
            if not raw.strip():
                continue
            try:
                fields = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise InputRowError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from exc
            if not isinstance(fields, dict):
                raise InputRowError(f"{where}: a row must be a JSON object, got {type(fields).__name__}")
            row_id = fields.get(columns.id, f"line-{number}")
            if not isinstance(row_id, (str, int)) or isinstance(row_id, bool):
                raise InputRowError(f"{where}: {columns.id!r} must be a string or an integer, got {row_id!r}")
            row_id = str(row_id)
            if row_id in seen:
                raise InputRowError(f"{where}: id {row_id!r} was already used on line {seen[row_id]}")
            seen[row_id] = number
            if needs_text and not isinstance(fields.get(columns.response), str):
                raise InputRowError(f"{where}: no text in column {columns.response!r} (--response-column)")
            if columns.image is not None:
                image = fields.get(columns.image)
                if not isinstance(image, str) or not (path.parent / image).is_file():
                    raise InputRowError(f"{where}: column {columns.image!r} must name an image file, got {image!r}")
            rows.append(Row(number, row_id, fields))
    return rows


def header_for(panel: RewardPanel, recipe: str, columns: Columns) -> dict[str, Any]:
    terms = {}
    for term in panel.terms:
        shape = term.backend.shape
        terms[term.name] = {
            "scorer": shape.name if shape else None,
            "revision": shape.revision if shape else None,
            "identity_hash": term.backend.identity_hash,
        }
    return {
        HEADER_KEY: FORMAT_VERSION,
        "identity_hash": panel.identity_hash,
        "terms": terms,
        "recipe": recipe,
        "columns": asdict(columns),
    }


def read_output(path: Path) -> tuple[dict[str, Any] | None, set[str], int]:
    """(header, ids written, bytes of whole valid lines): a torn last line is not counted."""
    done: set[str] = set()
    header = None
    valid = 0
    with open(path, "rb") as handle:
        data = handle.read()
    lines = data.split(b"\n")
    for index, raw in enumerate(lines):
        complete = index < len(lines) - 1  # the text after the last newline is torn (or empty)
        if not complete:
            break
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as exc:
            if index == len(lines) - 2 and not lines[-1]:  # the last line, cut short by a kill
                break
            raise ResumeRefused(f"{path}:{index + 1} is not JSON: not an output this command wrote") from exc
        if index == 0:
            if not isinstance(record, dict) or record.get(HEADER_KEY) != FORMAT_VERSION:
                raise ResumeRefused(f"{path} has no managed-scorers header: not an output this command wrote")
            header = record
        else:
            done.add(str(record["id"]))
        valid += len(raw) + 1
    return header, done, valid


def _check_resumable(old: dict[str, Any] | None, new: dict[str, Any], path: Path) -> None:
    if old is None:
        return
    if old["identity_hash"] == new["identity_hash"]:
        return
    changed = [
        f"{name}: {old['terms'].get(name)} -> {terms}"
        for name, terms in new["terms"].items()
        if old["terms"].get(name) != terms
    ] + [f"{name}: removed" for name in old["terms"] if name not in new["terms"]]
    raise ResumeRefused(
        f"{path} was scored by identity {old['identity_hash'][:12]}, this recipe is {new['identity_hash'][:12]} "
        f"({'; '.join(changed) or 'weights, required flags or applicability changed'}): write to a new output"
    )


def _item(row: Row, columns: Columns, base: Path) -> RewardItem:
    fields = row.fields
    image = None
    if columns.image is not None:
        from PIL import Image

        with Image.open(base / fields[columns.image]) as opened:
            image = np.asarray(opened.convert("RGB"))
    return RewardItem(
        id=row.id,
        prompt=fields.get(columns.prompt),
        text=fields.get(columns.response),
        image=image,
        reference=fields.get(columns.reference),
        group_id=None if columns.group is None else str(fields[columns.group]),
        data_source=fields.get(columns.data_source),
    )


def _group_of(row: Row, columns: Columns) -> str | None:
    return None if columns.group is None else str(row.fields.get(columns.group))


def _results(panel: RewardPanel, items: list[RewardItem]) -> Iterator[tuple[dict[str, Any], Any]]:
    """Rows for `items`; a refused batch is split (whole groups) until the refused rows are isolated."""
    try:
        response = panel.compute_rewards(RewardRequest(items=items, group_size=panel.group_size))
    except ScorerRequestError as exc:
        if exc.kind not in PER_ROW_KINDS:
            raise
        units = micro_batches(items, 1, lambda item: item.group_id)  # single rows, or whole groups
        if len(units) == 1:
            for item in items:
                yield {"id": item.id, "reward": None, "components": {}, "error": f"{type(exc).__name__}: {exc}"}, None
            return
        half = len(units) // 2
        for part in ([i for unit in units[:half] for i in unit], [i for unit in units[half:] for i in unit]):
            yield from _results(panel, part)
        return
    for index, item_id in enumerate(response.ids):
        ok = response.successes[index]
        yield (
            {
                "id": item_id,
                "reward": response.rewards[index] if ok else None,
                "components": {name: values[index] for name, values in response.component_rewards.items()},
                "error": response.errors[index],
            },
            response.diagnostics if index == 0 else None,
        )


def score_dataset(
    panel: RewardPanel,
    rows: Sequence[Row],
    output: Path,
    header: dict[str, Any],
    columns: Columns,
    input_dir: Path,
    batch_size: int = 64,
    resume: bool = False,
    progress: Callable[[int, int], Callable[[int], None]] | None = None,
) -> Summary:
    """Score `rows` into `output` (see the module docstring); KeyboardInterrupt leaves it resumable."""
    started = time.monotonic()
    done: set[str] = set()
    if output.exists() and output.stat().st_size > 0:
        if not resume:
            raise ConfigError(f"{output} exists: pass --resume to continue it, or choose another output")
        old, done, valid = read_output(output)
        _check_resumable(old, header, output)
        with open(output, "r+b") as handle:
            handle.truncate(valid)  # drop a torn last line
    todo = [row for row in rows if row.id not in done]
    summary = Summary(total=len(rows), skipped=len(rows) - len(todo))
    advance = progress(summary.total, summary.skipped) if progress is not None else None
    with open(output, "a", encoding="utf-8") as out:
        if not done and out.tell() == 0:
            _write(out, [header])
        for batch in micro_batches(todo, batch_size, lambda row: _group_of(row, columns)):
            items = [_item(row, columns, input_dir) for row in batch]
            written = []
            for record, diagnostics in _results(panel, items):
                written.append(record)
                if diagnostics:
                    summary.diagnostics = merge_term_reports([summary.diagnostics, diagnostics])
            if [r["id"] for r in written] != [row.id for row in batch]:
                raise RuntimeError("scored rows came back out of input order")  # never written misaligned
            errors = [r for r in written if r["reward"] is None]
            if errors and len(errors) == len(written) and len(written) > 1:
                raise ScorerRequestError(f"every row of a batch failed on its own, e.g. {errors[0]['error']}")
            _write(out, written)
            summary.scored += len(written)
            summary.errors += len(errors)
            summary.reward_sum += sum(r["reward"] for r in written if r["reward"] is not None)
            if advance is not None:
                advance(len(written))
    summary.seconds = time.monotonic() - started
    return summary


def _write(out: IO[str], records: list[dict[str, Any]]) -> None:
    """Whole lines, flushed together: a kill leaves at most one torn line, which resume drops."""
    out.write("".join(json.dumps(record, allow_nan=False) + "\n" for record in records))
    out.flush()
    os.fsync(out.fileno())


def metrics_line(summary: Summary) -> str:
    metrics = to_metrics(summary.diagnostics, "val") if summary.diagnostics else {}
    return "  ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()) if math.isfinite(v))
