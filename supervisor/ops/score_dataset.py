"""Score a JSONL dataset through a panel: one output row per input row, in input order, resumable.

The output starts with a header line (the panel's identity hash and each term's scorer and
revision); every other line is one input row's result: `id`, `reward` (null when the row could
not be scored), `components` (null where a term does not apply, or failed), `failed_terms`
(optional terms that failed for this row, and why: its reward lacks them) and `error` (why
there is no reward). A row with an error or a failed term is not clean: it is counted,
`--retry-errors` scores it again, and the run's exit status says so.
Each row also carries `input_sha`, a digest of its input row. Rows are written a whole batch
at a time, flushed, so an interrupted run (Ctrl-C, a kill) leaves a valid prefix; `resume`
keeps the rows that are a prefix of this input (same ids, same digests, same columns, else it
refuses), drops a torn last line and a group cut short, and refuses an output made by another
identity (a changed revision, params or weights). Malformed input fails before anything is
scored or started, naming the file and line. A batch the scorer refuses is split until the
refused rows (or groups) are isolated: each gets `reward: null` and its error, never a reward;
when every unit of a batch fails on its own, or 10 units in a row do, the run stops instead.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from scorers.diagnostics import merge_term_reports, to_metrics
from scorers.groups import COMMON_INPUTS, NotContiguous, contiguous_runs, strict_key
from scorers.identity import digest
from supervisor.compose.overlap import micro_batches
from supervisor.compose.panel import RewardPanel
from supervisor.errors import ConfigError, ScorerItemsFailed, ScorerRequestError, validation_message
from supervisor.types import RewardItem, RewardRequest, RewardResponse

HEADER_KEY = "managed_scorers_output"
FORMAT_VERSION = 1
PER_ROW_KINDS = ("bad_input", "scorer_error")  # what a row can cause; anything else stops the run
STOP_AFTER_FAILED_UNITS = 10  # rows or groups failing one after another: the scorer, not the data


class OutputClaim:
    """The output file, held by one run: created exclusively when new, never opened through a symbolic
    link, and locked (flock) for the whole run, so a second run on it is refused, not interleaved.
    A rewrite (`replace`) goes to an exclusively created temporary file, locked before it is renamed
    over the output, so the lock never lapses. A file this claim created and left empty is removed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if not path.parent.is_dir():
            raise ConfigError(f"{path.parent} does not exist: create it, or choose another output")
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags)
            self.created = False
        except FileNotFoundError:
            fd = self._create(path, flags)
        except OSError as exc:
            raise self._refused(exc) from exc
        self.file = self._locked(fd)

    def _create(self, path: Path, flags: int) -> int:
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError as exc:
            raise ConfigError(f"{path} was created by another run meanwhile: choose another output") from exc
        except OSError as exc:
            raise self._refused(exc) from exc
        self.created = True
        return fd

    def _refused(self, exc: OSError) -> ConfigError:
        if exc.errno == errno.ELOOP:
            return ConfigError(f"{self.path} is a symbolic link: give the file it points to as --output")
        return ConfigError(f"cannot open {self.path}: {exc.strerror}")

    def _locked(self, fd: int, check_path: bool = True) -> IO[str]:
        """`fd` locked, or refused: another run holds it, or (`check_path`) the path no longer names it
        (another run's rewrite renamed a new file over it while this one waited to open it)."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if check_path and os.stat(self.path, follow_symlinks=False).st_ino != os.fstat(fd).st_ino:
                raise BlockingIOError
        except (BlockingIOError, FileNotFoundError):
            os.close(fd)
            raise ConfigError(f"{self.path} is being written by another managed-scorers score run") from None
        return os.fdopen(fd, "r+", encoding="utf-8")

    def replace(self, content: str) -> None:
        """Put `content` in place of the output whole: a kill meanwhile leaves the old file."""
        fd, temporary = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        handle: IO[str] | None = None
        try:
            handle = self._locked(fd, check_path=False)  # not yet at the path: it will be, locked
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
            os.fchmod(handle.fileno(), os.fstat(self.file.fileno()).st_mode & 0o777)
            os.replace(temporary, self.path)
        except BaseException:
            if handle is not None:
                handle.close()
            os.unlink(temporary)
            raise
        self.file.close()
        self.file = handle

    def close(self) -> None:
        empty = self.created and os.fstat(self.file.fileno()).st_size == 0
        if empty:
            self.path.unlink(missing_ok=True)  # still ours: unlinked before the lock goes
        self.file.close()


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
    digest: str  # of the whole input row: a resumed output must have been made from this very row


@dataclass
class ResumePlan:
    """What an existing output holds: its header, how many leading input rows it covers, where to cut it."""

    header: dict[str, Any] | None = None
    done: int = 0
    truncate_at: int = 0
    retry: list[int] = field(default_factory=list)  # rows already written with an error, to score again


@dataclass
class Summary:
    total: int
    skipped: int  # already in the output (resume)
    scored: int = 0
    retried: int = 0  # rows written with an error before, scored again (--retry-errors)
    errors: int = 0  # rows with no reward
    partial: int = 0  # rows whose reward lacks an optional term that failed for them
    reward_sum: float = 0.0
    diagnostics: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return not self.errors and not self.partial

    def line(self) -> str:
        ok = self.scored - self.errors
        mean = f"{self.reward_sum / ok:.4f}" if ok else "-"
        return (
            f"{self.scored} rows scored ({self.errors} with errors, {self.partial} missing a failed optional term), "
            f"{self.skipped} already done" + (f" ({self.retried} of them scored again)" if self.retried else "") + ", "
            f"mean reward {mean}, {self.seconds:.1f} s"
        )


def read_rows(path: Path, columns: Columns, needs_text: bool, group_size: int | None = None) -> list[Row]:
    """Every row, checked before anything is scored or started: UTF-8 JSON objects, unique ids, the
    needed fields, a valid item (types, finite numbers), images that open, groups contiguous, of
    `group_size` when one is declared, and sharing their prompt, reference and data source."""
    rows: list[Row] = []
    seen: dict[str, int] = {}
    with open(path, "rb") as handle:
        for number, encoded in enumerate(handle, start=1):
            where = f"{path}:{number}"
            fields = _decoded(encoded, where)
            if fields is None:
                continue
            row = Row(number, _row_id(fields, columns, number, where), fields, digest(fields, allow_nan=True)[:16])
            if row.id in seen:
                raise InputRowError(f"{where}: id {row.id!r} was already used on line {seen[row.id]}")
            seen[row.id] = number
            _check_fields(row, columns, needs_text, path.parent, where)
            rows.append(row)
    if columns.group is not None:
        _check_contiguous(path, rows, columns)
        _check_groups(path, rows, columns, group_size)
    return rows


def _decoded(encoded: bytes, where: str) -> dict[str, Any] | None:
    """One line's JSON object (None for a blank line)."""
    try:
        raw = encoded.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputRowError(f"{where}: not UTF-8 (byte {exc.start + 1}: {exc.reason})") from exc
    if not raw.strip():
        return None
    try:
        fields = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InputRowError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from exc
    except (ValueError, RecursionError) as exc:  # a 5,000-digit number; brackets nested 100,000 deep
        raise InputRowError(f"{where}: not readable JSON ({type(exc).__name__}: {str(exc)[:120]})") from exc
    if not isinstance(fields, dict):
        raise InputRowError(f"{where}: a row must be a JSON object, got {type(fields).__name__}")
    return fields


def _row_id(fields: dict[str, Any], columns: Columns, number: int, where: str) -> str:
    row_id = fields.get(columns.id, f"line-{number}")
    if not isinstance(row_id, (str, int)) or isinstance(row_id, bool):
        raise InputRowError(f"{where}: {columns.id!r} must be a string or an integer, got {row_id!r}")
    return str(row_id)


def _check_fields(row: Row, columns: Columns, needs_text: bool, base: Path, where: str) -> None:
    """The row's own fields: text, image, group key, and a valid item (types, finite numbers)."""
    fields = row.fields
    if needs_text and not isinstance(fields.get(columns.response), str):
        raise InputRowError(f"{where}: no text in column {columns.response!r} (--response-column)")
    if columns.image is not None:
        _check_image(fields.get(columns.image), base, columns.image, where)
    if columns.group is not None:
        group = fields.get(columns.group)
        if not isinstance(group, (str, int)) or isinstance(group, bool):
            raise InputRowError(f"{where}: column {columns.group!r} must hold a group (string or integer)")
    try:
        _item(row, columns)
    except ValueError as exc:  # pydantic's ValidationError: a type, an empty id, a NaN
        raise InputRowError(f"{where}: {validation_message(exc)}") from exc


def _check_contiguous(path: Path, rows: Sequence[Row], columns: Columns) -> None:
    try:
        contiguous_runs([_group_of(row, columns) for row in rows])
    except NotContiguous as exc:
        raise InputRowError(
            f"{path}:{rows[exc.position].line}: group {exc.group!r} began on line {rows[exc.started].line}: "
            "groups must be contiguous"
        ) from exc


def _check_groups(path: Path, rows: Sequence[Row], columns: Columns, group_size: int | None) -> None:
    """Each group of `group_size` rows (when declared), whose prompt, reference and data source are
    the same (type-strictly): what the scorers would refuse after boot, named by line before it."""
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(_group_of(row, columns) or "", []).append(row)
    names = {"prompt": columns.prompt, "reference": columns.reference, "data_source": columns.data_source}
    for group, members in groups.items():
        if group_size is not None and len(members) != group_size:
            raise InputRowError(
                f"{path}:{members[0].line}: group {group!r} has {len(members)} rows (lines "
                f"{', '.join(str(r.line) for r in members[:8])}), the recipe's group_size is {group_size}"
            )
        for common in COMMON_INPUTS:
            column = names[common]
            expected = strict_key(members[0].fields.get(column))
            for row in members[1:]:
                if strict_key(row.fields.get(column)) != expected:
                    raise InputRowError(
                        f"{path}:{row.line}: column {column!r} differs from line {members[0].line}, the first of "
                        f"group {group!r}: the rows of a group share their {common} (a missing one differs too)"
                    )


def _check_image(value: Any, base: Path, column: str, where: str) -> None:
    from PIL import Image, UnidentifiedImageError

    if not isinstance(value, str) or not (base / value).is_file():
        raise InputRowError(f"{where}: column {column!r} must name an image file, got {value!r}")
    try:
        with Image.open(base / value):  # the header only: a file that is not an image fails here, not mid-run
            pass
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
        raise InputRowError(f"{where}: {value} is not a readable image ({type(exc).__name__}: {exc})") from exc


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


def read_output(path: Path) -> tuple[dict[str, Any], list[tuple[str, str, bool]], list[int], int]:
    """(header, (id, input_sha, clean) per row, each row's end offset, the header's end offset).

    A torn last row (a kill mid-write) is left out; a file with no whole managed-scorers header
    line, or with anything else that is not a row, is refused: it is not an output of this command."""
    with open(path, "rb") as handle:
        data = handle.read()
    lines = data.split(b"\n")
    complete, torn = lines[:-1], lines[-1]
    not_ours = f"{path} is not an output of managed-scorers score"
    if not complete:
        raise ResumeRefused(f"{not_ours} (no whole header line)")
    try:
        header = json.loads(complete[0])
    except json.JSONDecodeError as exc:
        raise ResumeRefused(f"{not_ours} (its first line is not JSON)") from exc
    if not isinstance(header, dict) or header.get(HEADER_KEY) != FORMAT_VERSION or "identity_hash" not in header:
        raise ResumeRefused(f"{not_ours} (no managed-scorers header)")
    offset = len(complete[0]) + 1
    header_end, rows, ends = offset, [], []
    for index, raw in enumerate(complete[1:], start=2):
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as exc:
            if index == len(complete) and not torn:  # the last line, cut short before its newline was lost
                break
            raise ResumeRefused(f"{path}:{index} is not JSON: {not_ours}") from exc
        if not isinstance(record, dict) or "id" not in record or "input_sha" not in record:
            raise ResumeRefused(f"{path}:{index} is not a row: {not_ours}")
        offset += len(raw) + 1
        clean = record.get("reward") is not None and not record.get("failed_terms")
        rows.append((str(record["id"]), str(record["input_sha"]), clean))
        ends.append(offset)
    return header, rows, ends, header_end


def plan_output(
    claim: OutputClaim, rows: Sequence[Row], columns: Columns, resume: bool, retry_errors: bool = False
) -> ResumePlan:
    """Checked before any child starts: may this output be written, and from which input row on."""
    output = claim.path
    if os.fstat(claim.file.fileno()).st_size == 0:
        return ResumePlan()
    if not resume:
        raise ConfigError(f"{output} exists: pass --resume to continue it, or choose another output")
    header, written, ends, header_end = read_output(output)
    if header.get("columns") != asdict(columns):
        raise ResumeRefused(f"{output} was written with columns {header.get('columns')}, not {asdict(columns)}")
    if len(written) > len(rows):
        raise ResumeRefused(f"{output} holds {len(written)} rows, this input only {len(rows)}: another input")
    for index, (row_id, sha, _) in enumerate(written):
        row = rows[index]
        if (row.id, row.digest) != (row_id, sha):
            raise ResumeRefused(
                f"{output} row {index + 1} ({row_id!r}) is not input line {row.line} ({row.id!r}) as it is now: "
                "the input changed, or is another one; write to a new output"
            )
    done = len(written)
    if columns.group is not None:  # never finish a group that a torn write cut short with fewer candidates
        while 0 < done < len(rows) and _group_of(rows[done - 1], columns) == _group_of(rows[done], columns):
            done -= 1
    retry: list[int] = []
    if retry_errors:  # rows written with an error or a failed term, each with its whole group
        failed = {_group_of(rows[i], columns) or f"row:{rows[i].id}" for i in range(done) if not written[i][2]}
        retry = [i for i in range(done) if (_group_of(rows[i], columns) or f"row:{rows[i].id}") in failed]
    return ResumePlan(header, done, ends[done - 1] if done else header_end, retry)


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


def _decoded_image(row: Row, columns: Columns, base: Path) -> np.ndarray | None:
    """The row's image as RGB pixels (OSError, SyntaxError or DecompressionBombError: it does not decode)."""
    if columns.image is None:
        return None
    from PIL import Image

    with Image.open(base / row.fields[columns.image]) as opened:
        return np.asarray(opened.convert("RGB"))


def _item(row: Row, columns: Columns, image: np.ndarray | None = None) -> RewardItem:
    fields = row.fields
    return RewardItem(
        id=row.id,
        prompt=fields.get(columns.prompt),
        text=fields.get(columns.response),
        image=image,
        reference=fields.get(columns.reference),
        group_id=_group_of(row, columns),
        data_source=fields.get(columns.data_source),
    )


def _items(batch: Sequence[Row], columns: Columns, input_dir: Path) -> tuple[list[RewardItem], dict[str, str]]:
    """The batch's items, and why each row that cannot become one failed: an image that opened at the
    check but does not decode (cut short, corrupt). Such a row takes its whole group with it."""
    items, unreadable, broken = [], {}, set()
    for row in batch:
        try:
            image = _decoded_image(row, columns, input_dir)
        except Exception as exc:  # noqa: BLE001 - whatever the decoder raises (OSError cut short, SyntaxError, ValueError, zlib.error, DecompressionBombError...) is this row's input fault
            unreadable[row.id] = f"input line {row.line}: cannot decode its image ({type(exc).__name__}: {exc})"
            broken.add(_group_of(row, columns))
            continue
        items.append(_item(row, columns, image))
    broken.discard(None)
    for row in batch:
        if row.id not in unreadable and _group_of(row, columns) in broken:
            unreadable[row.id] = f"input line {row.line}: a member of its group has an image that cannot be decoded"
    return [item for item in items if item.id not in unreadable], unreadable


def _group_of(row: Row, columns: Columns) -> str | None:
    return None if columns.group is None else str(row.fields.get(columns.group))


def _results(panel: RewardPanel, items: list[RewardItem]) -> Iterator[tuple[dict[str, Any], Any]]:
    """Rows for `items`; a refused batch is split (whole groups) until the refused rows are isolated."""
    try:
        response = panel.compute_rewards(RewardRequest(items=items, group_size=panel.group_size))
    except ScorerItemsFailed as exc:  # a required term could not score these rows: they fail, the rest is rescored
        if not any(item.id in exc.failed for item in items):
            raise
        yield from _without_failed(panel, items, exc)
        return
    except ScorerRequestError as exc:
        if exc.kind not in PER_ROW_KINDS:
            raise
        yield from _bisected(panel, items, exc)
        return
    yield from _scored_rows(response)


def _without_failed(
    panel: RewardPanel, items: list[RewardItem], exc: ScorerItemsFailed
) -> Iterator[tuple[dict[str, Any], Any]]:
    """The failed rows as failed, the rest rescored, in input order. A failed row takes its whole
    group down: its siblings' group-relative rewards would be wrong."""
    groups = {item.group_id for item in items if item.id in exc.failed and item.group_id is not None}
    reasons = {
        item.id: exc.failed.get(item.id, "a member of its group could not be scored")
        for item in items
        if item.id in exc.failed or item.group_id in groups
    }
    scored = [item for item in items if item.id not in reasons]
    rest = iter(list(_results(panel, scored)) if scored else [])
    for item in items:
        if item.id in reasons:
            yield _failed_row(item.id, f"{type(exc).__name__}: {reasons[item.id]}"), None
        else:
            yield next(rest)


def _bisected(
    panel: RewardPanel, items: list[RewardItem], exc: ScorerRequestError
) -> Iterator[tuple[dict[str, Any], Any]]:
    """A refused batch split in halves (whole groups) until the refused rows stand alone."""
    units = micro_batches(items, 1, lambda item: item.group_id)  # single rows, or whole groups
    if len(units) == 1:
        for item in items:
            yield _failed_row(item.id, f"{type(exc).__name__}: {exc}"), None
        return
    half = len(units) // 2
    for part in ([i for unit in units[:half] for i in unit], [i for unit in units[half:] for i in unit]):
        yield from _results(panel, part)


def _scored_rows(response: RewardResponse) -> Iterator[tuple[dict[str, Any], Any]]:
    """One output row per item (the first carries the batch's diagnostics)."""
    failed_terms: dict[str, dict[str, str]] = {}
    for failure in response.term_failures:
        for item_id in failure.ids:
            failed_terms.setdefault(item_id, {})[failure.term] = f"{failure.kind}: {failure.error}"
    for index, item_id in enumerate(response.ids):
        partial = failed_terms.get(item_id, {})
        failed = not response.successes[index] and not partial  # not a success, and not for an optional term
        yield (
            {
                "id": item_id,
                "reward": None if failed else response.rewards[index],
                "components": {name: values[index] for name, values in response.component_rewards.items()},
                "failed_terms": partial,
                "error": response.errors[index] if failed else None,
            },
            response.diagnostics if index == 0 else None,
        )


def _failed_row(item_id: str, error: str) -> dict[str, Any]:
    return {"id": item_id, "reward": None, "components": {}, "failed_terms": {}, "error": error}


def score_dataset(
    panel: RewardPanel,
    rows: Sequence[Row],
    claim: OutputClaim,
    header: dict[str, Any],
    columns: Columns,
    input_dir: Path,
    plan: ResumePlan,
    batch_size: int = 64,
    progress: Callable[[int, int], Callable[[int], None]] | None = None,
) -> Summary:
    """Score `rows[plan.done:]` into `output` (see the module docstring); KeyboardInterrupt leaves it resumable."""
    started = time.monotonic()
    _check_resumable(plan.header, header, claim.path)
    todo = rows[plan.done :]
    summary = Summary(total=len(rows), skipped=plan.done)
    advance = progress(summary.total, summary.skipped) if progress is not None else None
    failed_in_a_row = 0
    if plan.retry:
        plan = _retry_errors(panel, rows, claim, columns, input_dir, plan, batch_size, summary)
    out = claim.file
    if plan.header is None:
        out.truncate(0)
        _write(out, [header])
    else:
        out.truncate(plan.truncate_at)  # a torn last line, or a group cut short, goes
        out.seek(plan.truncate_at)
    for batch in micro_batches(todo, batch_size, lambda row: _group_of(row, columns)):
        written, failed_in_a_row = _score_batch(panel, batch, columns, input_dir, summary, failed_in_a_row)
        _write(out, written)
        summary.scored += len(written)
        summary.errors += sum(r["reward"] is None for r in written)
        summary.partial += sum(bool(r["failed_terms"]) for r in written)
        summary.reward_sum += sum(r["reward"] for r in written if r["reward"] is not None)
        if advance is not None:
            advance(len(written))
    summary.seconds = time.monotonic() - started
    return summary


def _score_batch(
    panel: RewardPanel,
    batch: Sequence[Row],
    columns: Columns,
    input_dir: Path,
    summary: Summary,
    failed_in_a_row: int,
) -> tuple[list[dict[str, Any]], int]:
    """The output records of one batch, in input order; raises instead when the failures look systemic."""
    built, unreadable = _items(batch, columns, input_dir)
    scored = iter(_results(panel, built) if built else [])
    written = []
    for row in batch:
        if row.id in unreadable:
            written.append(_failed_row(row.id, unreadable[row.id]))
            continue
        record, diagnostics = next(scored)
        written.append(record)
        if diagnostics:
            summary.diagnostics = merge_term_reports([summary.diagnostics, diagnostics])
    if [r["id"] for r in written] != [row.id for row in batch]:
        raise RuntimeError("scored rows came back out of input order")  # never written misaligned
    # rows whose input would not decode are the data's fault, not the scorer's: they never stop the run
    units = _unit_failures(
        [r for r in batch if r.id not in unreadable], [w for w in written if w["id"] not in unreadable], columns
    )
    failed_in_a_row = _consecutive_failures(failed_in_a_row, units)
    if (len(units) > 1 and all(units)) or failed_in_a_row >= STOP_AFTER_FAILED_UNITS:
        first = next(r["error"] for r in written if r["reward"] is None)
        raise ScorerRequestError(f"{failed_in_a_row} rows or groups in a row failed on their own, e.g. {first}")
    for record, row in zip(written, batch, strict=True):
        record["input_sha"] = row.digest
    return written, failed_in_a_row


def _retry_errors(
    panel: RewardPanel,
    rows: Sequence[Row],
    claim: OutputClaim,
    columns: Columns,
    input_dir: Path,
    plan: ResumePlan,
    batch_size: int,
    summary: Summary,
) -> ResumePlan:
    """Score the written error rows again and put their new records in place: the file is rewritten
    whole under a temporary name, then renamed over the output (a kill meanwhile leaves the old one)."""
    output = claim.path
    again = [rows[i] for i in plan.retry]
    fresh: dict[str, str] = {}
    for batch in micro_batches(again, batch_size, lambda row: _group_of(row, columns)):
        written, _ = _score_batch(panel, batch, columns, input_dir, summary, 0)
        fresh.update({record["id"]: json.dumps(record, allow_nan=False) + "\n" for record in written})
        summary.retried += len(written)
        summary.errors += sum(r["reward"] is None for r in written)
        summary.partial += sum(bool(r["failed_terms"]) for r in written)
    with open(output, "rb") as handle:
        lines = handle.read()[: plan.truncate_at].decode("utf-8").splitlines(keepends=True)
    rewritten = [lines[0]] + [fresh.get(rows[i].id, line) for i, line in enumerate(lines[1:])]
    claim.replace("".join(rewritten))
    return ResumePlan(plan.header, plan.done, sum(len(line.encode()) for line in rewritten))


def _unit_failures(batch: Sequence[Row], written: list[dict[str, Any]], columns: Columns) -> list[bool]:
    """Per unit of the batch (a group, or a row of its own), in order: did every row of it fail?"""
    units: dict[str, bool] = {}
    for row, record in zip(batch, written, strict=True):
        key = _group_of(row, columns) or f"row:{row.id}"
        units[key] = units.get(key, True) and record["reward"] is None
    return list(units.values())


def _consecutive_failures(count: int, units: list[bool]) -> int:
    for failed in units:
        count = count + 1 if failed else 0
    return count


def _write(out: IO[str], records: list[dict[str, Any]]) -> None:
    """Whole lines, flushed together: a kill leaves at most one torn line, which resume drops."""
    out.write("".join(json.dumps(record, allow_nan=False) + "\n" for record in records))
    out.flush()
    os.fsync(out.fileno())


def metrics_line(summary: Summary, namespace: str = "train") -> str:
    """The run's diagnostics as metrics, named as a trainer logs them: `train/...`, or `val/...` for the
    validation panel."""
    metrics = to_metrics(summary.diagnostics, namespace) if summary.diagnostics else {}
    return "  ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()) if math.isfinite(v))
