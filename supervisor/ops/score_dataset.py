"""Score a dataset through a panel: one output row per input row, in input order, resumable.

The run's metadata (the panel's identity hash, each term's scorer and revision) goes to a sidecar
beside the output (`OUT.meta.json`); each output line is one input row's result: `id`, `reward`
(null when the row could not be scored), `components` (null where a term does not apply, or failed),
`failed_terms` (optional terms that failed for this row, and why: its reward lacks them) and `error`
(why there is no reward). A row with an error or a failed term is not clean: it is counted,
`--retry-errors` scores it again, and the run's exit status says so.
Each row also carries `input_sha`, a digest of its input row. Rows are written a whole batch
at a time, flushed, so an interrupted run (Ctrl-C, a kill) leaves a valid prefix; `resume`
keeps the rows that are a prefix of this input (same ids, same digests, same columns, else it
refuses), drops a torn last line and a group cut short, and refuses an output made by another
identity (a changed revision, params or weights). Malformed input fails before anything is
scored or started, naming the file and line. A batch the scorer refuses is split until the
refused rows (or groups) are isolated: each gets `reward: null` and its error, never a reward;
when every unit of a batch fails on its own, or 10 units in a row do, the run stops instead.
Reading and checking the input: `dataset_rows`; the output file, its sidecar and resume:
`dataset_output` (stdout and Parquet: `dataset_sinks`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scorers import tail
from scorers.diagnostics import merge_term_reports, to_metrics
from supervisor.compose.overlap import micro_batches
from supervisor.compose.panel import RewardPanel
from supervisor.errors import ScorerItemsFailed, ScorerRequestError
from supervisor.ops.dataset_output import ResumePlan, Sink, check_resumable
from supervisor.ops.dataset_rows import Columns, Row, group_of, items_of
from supervisor.types import RewardItem, RewardRequest, RewardResponse

PER_ROW_KINDS = ("bad_input", "scorer_error")  # what a row can cause; anything else stops the run


STOP_AFTER_FAILED_UNITS = 10  # rows or groups failing one after another: the scorer, not the data


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
            f"{self.scored} rows scored ({self.errors} with errors, {self.partial} missing a "
            f"failed optional term), {self.skipped} already done"
            + (f" ({self.retried} of them scored again)" if self.retried else "")
            + ", "
            f"mean reward {mean}, {self.seconds:.1f} s"
        )


def _results(panel: RewardPanel, items: list[RewardItem]) -> Iterator[tuple[dict[str, Any], Any]]:
    """Rows for `items`; a refused batch is split (whole groups) until the refused rows are
    isolated."""
    try:
        response = panel.compute_rewards(RewardRequest(items=items, group_size=panel.group_size))
    # a required term could not score these rows: they fail, the rest is rescored
    except ScorerItemsFailed as exc:
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
    groups = {
        item.group_id for item in items if item.id in exc.failed and item.group_id is not None
    }
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
    for part in (
        [i for unit in units[:half] for i in unit],
        [i for unit in units[half:] for i in unit],
    ):
        yield from _results(panel, part)


def _scored_rows(response: RewardResponse) -> Iterator[tuple[dict[str, Any], Any]]:
    """One output row per item (the first carries the batch's diagnostics); `details` where a scorer
    said something of the item (a code reward's verdict per test), by term."""
    failed_terms: dict[str, dict[str, str]] = {}
    for failure in response.term_failures:
        for item_id in failure.ids:
            failed_terms.setdefault(item_id, {})[failure.term] = f"{failure.kind}: {failure.error}"
    for index, item_id in enumerate(response.ids):
        partial = failed_terms.get(item_id, {})
        # not a success, and not for an optional term
        failed = not response.successes[index] and not partial
        row: dict[str, Any] = {
            "id": item_id,
            "reward": None if failed else response.rewards[index],
            "components": {
                name: values[index] for name, values in response.component_rewards.items()
            },
            "failed_terms": partial,
            "error": response.errors[index] if failed else None,
        }
        details = response.details_for(item_id)
        if details:
            row["details"] = details
        yield row, response.diagnostics if index == 0 else None


def _failed_row(item_id: str, error: str) -> dict[str, Any]:
    return {"id": item_id, "reward": None, "components": {}, "failed_terms": {}, "error": error}


def score_dataset(
    panel: RewardPanel,
    rows: Sequence[Row],
    claim: Sink,
    header: dict[str, Any],
    columns: Columns,
    input_dir: Path,
    plan: ResumePlan,
    batch_size: int = 64,
    progress: Callable[[int, int], Callable[[int], None]] | None = None,
) -> Summary:
    """Score `rows[plan.done:]` into `output` (see the module docstring); KeyboardInterrupt leaves
    it resumable."""
    started = time.monotonic()
    check_resumable(plan.header, header, claim.path)
    todo = rows[plan.done :]
    summary = Summary(total=len(rows), skipped=plan.done)
    advance = progress(summary.total, summary.skipped) if progress is not None else None
    failed_in_a_row = 0
    if plan.retry:
        plan = _retry_errors(panel, rows, claim, columns, input_dir, plan, batch_size, summary)
    if plan.header is None:
        claim.start(header)
    else:
        claim.cut(plan.truncate_at)  # a torn last line, or a group cut short, goes
    for batch in micro_batches(todo, batch_size, lambda row: group_of(row, columns)):
        written, failed_in_a_row = _score_batch(
            panel, batch, columns, input_dir, summary, failed_in_a_row
        )
        claim.write(_lines(written))
        summary.scored += len(written)
        summary.errors += sum(r["reward"] is None for r in written)
        summary.partial += sum(bool(r["failed_terms"]) for r in written)
        summary.reward_sum += sum(r["reward"] for r in written if r["reward"] is not None)
        if advance is not None:
            advance(len(written))
    claim.finish(header)
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
    """The output records of one batch, in input order; raises instead when the failures look
    systemic."""
    built, unreadable = items_of(batch, columns, input_dir)
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
    # rows whose input would not decode are the data's fault, not the scorer's: they never stop the
    # run
    units = _unit_failures(
        [r for r in batch if r.id not in unreadable],
        [w for w in written if w["id"] not in unreadable],
        columns,
    )
    failed_in_a_row = _consecutive_failures(failed_in_a_row, units)
    if (len(units) > 1 and all(units)) or failed_in_a_row >= STOP_AFTER_FAILED_UNITS:
        first = next(r["error"] for r in written if r["reward"] is None)
        raise ScorerRequestError(
            f"{failed_in_a_row} rows or groups in a row failed on their own, e.g. {first}"
        )
    for record, row in zip(written, batch, strict=True):
        record["input_sha"] = row.digest
    return written, failed_in_a_row


def _retry_errors(
    panel: RewardPanel,
    rows: Sequence[Row],
    claim: Sink,
    columns: Columns,
    input_dir: Path,
    plan: ResumePlan,
    batch_size: int,
    summary: Summary,
) -> ResumePlan:
    """Score the written error rows again and put their new records in place: the file is rewritten
    whole under a temporary name, then renamed over the output (a kill meanwhile leaves the old
    one)."""
    output = claim.path
    again = [rows[i] for i in plan.retry]
    fresh: dict[str, str] = {}
    for batch in micro_batches(again, batch_size, lambda row: group_of(row, columns)):
        written, _ = _score_batch(panel, batch, columns, input_dir, summary, 0)
        fresh.update(
            {record["id"]: json.dumps(record, allow_nan=False) + "\n" for record in written}
        )
        summary.retried += len(written)
        summary.errors += sum(r["reward"] is None for r in written)
        summary.partial += sum(bool(r["failed_terms"]) for r in written)
    with open(output, "rb") as handle:
        lines = handle.read()[: plan.truncate_at].decode("utf-8").splitlines(keepends=True)
    rewritten = [fresh.get(rows[i].id, line) for i, line in enumerate(lines)]
    claim.replace("".join(rewritten))
    return ResumePlan(plan.header, plan.done, sum(len(line.encode()) for line in rewritten))


def _unit_failures(
    batch: Sequence[Row], written: list[dict[str, Any]], columns: Columns
) -> list[bool]:
    """Per unit of the batch (a group, or a row of its own), in order: did every row of it fail?"""
    units: dict[str, bool] = {}
    for row, record in zip(batch, written, strict=True):
        key = group_of(row, columns) or f"row:{row.id}"
        units[key] = units.get(key, True) and record["reward"] is None
    return list(units.values())


def _consecutive_failures(count: int, units: list[bool]) -> int:
    for failed in units:
        count = count + 1 if failed else 0
    return count


def _lines(records: list[dict[str, Any]]) -> str:
    """Whole lines, written together: a kill leaves at most one torn line, which resume drops."""
    return "".join(json.dumps(record, allow_nan=False) + "\n" for record in records)


def tail_lines(summary: Summary) -> list[str]:
    """The run's latency histograms and slowest items, a line each, named by term: where its calls
    went slow, and which items they were."""
    return [
        f"{term} " + tail.describe(name, value)
        for term, rep in sorted(summary.diagnostics.items())
        for name, value in sorted(rep["values"].items())
        if tail.kind(value) is not None
    ]


def metrics_line(summary: Summary, namespace: str = "train") -> str:
    """The run's diagnostics as metrics, named as a trainer logs them: `train/...`, or `val/...` for
    the validation panel."""
    metrics = to_metrics(summary.diagnostics, namespace) if summary.diagnostics else {}
    return "  ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()) if math.isfinite(v))
