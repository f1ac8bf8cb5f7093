"""The output of `managed-scorers score`: claiming the file, its sidecar `OUT.meta.json` (the
panel's identity hash, each term's scorer and revision, the recipe and the columns: what once was a
header line, kept out of the rows so that pandas and `datasets` read exactly one record per input
row), and what a resumed run keeps of an earlier output (a prefix of this input, scored by the same
identity, as its sidecar says). Outputs to stdout and to Parquet: `dataset_sinks`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from supervisor.compose.panel import RewardPanel
from supervisor.composition import component
from supervisor.errors import ConfigError
from supervisor.ops.dataset_rows import Columns, Row, group_of

HEADER_KEY = "managed_scorers_output"


FORMAT_VERSION = 2  # 1: the metadata was the output's first line; 2: it is the sidecar
SIDECAR_SUFFIX = ".meta.json"


def sidecar_of(path: Path) -> Path:
    return path.with_name(path.name + SIDECAR_SUFFIX)


def write_sidecar(path: Path, header: dict[str, Any]) -> None:
    """The run's metadata beside `path`, whole or not at all (a temporary file renamed over it)."""
    target = sidecar_of(path)
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(header, indent=2) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):  # renamed already: nothing left to remove
            os.unlink(temporary)
        raise


class Sink(Protocol):
    """Where `score_dataset` writes records: a JSONL file (OutputClaim), stdout, a Parquet file."""

    path: Path
    interrupted: str  # what an interrupted run left, for its last line

    def start(self, header: dict[str, Any]) -> None: ...  # a new output: empty it, say its metadata

    # a resumed one: drop what follows byte `at`, append from there
    def cut(self, at: int) -> None: ...

    # whole lines, durable before it returns where the form allows
    def write(self, text: str) -> None: ...

    def replace(self, content: str) -> None: ...  # the whole JSONL content at once (--retry-errors)

    def finish(self, header: dict[str, Any]) -> None: ...  # every row is written

    def close(self) -> None: ...


class OutputClaim:
    """The output file, held by one run: created exclusively when new, never opened through a
    symbolic link, and locked (flock) for the whole run, so a second run on it is refused, not
    interleaved. A rewrite (`replace`) goes to an exclusively created temporary file, locked before
    it is renamed over the output, so the lock never lapses. A file this claim created and left
    empty is removed, with its sidecar."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.interrupted = f"{path} holds every row finished so far; rerun with --resume"
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
            raise ConfigError(
                f"{path} was created by another run meanwhile: choose another output"
            ) from exc
        except OSError as exc:
            raise self._refused(exc) from exc
        self.created = True
        return fd

    def _refused(self, exc: OSError) -> ConfigError:
        if exc.errno == errno.ELOOP:
            return ConfigError(
                f"{self.path} is a symbolic link: give the file it points to as --output"
            )
        return ConfigError(f"cannot open {self.path}: {exc.strerror}")

    def _locked(self, fd: int, check_path: bool = True) -> IO[str]:
        """`fd` locked, or refused: another run holds it, or (`check_path`) the path no longer names
        it (another run's rewrite renamed a new file over it while this one waited to open it)."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if (
                check_path
                and os.stat(self.path, follow_symlinks=False).st_ino != os.fstat(fd).st_ino
            ):
                raise BlockingIOError
        except (BlockingIOError, FileNotFoundError):
            os.close(fd)
            raise ConfigError(
                f"{self.path} is being written by another managed-scorers score run"
            ) from None
        return os.fdopen(fd, "r+", encoding="utf-8")

    def replace(self, content: str) -> None:
        """Put `content` in place of the output whole: a kill meanwhile leaves the old file."""
        fd, temporary = tempfile.mkstemp(
            prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent
        )
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

    def start(self, header: dict[str, Any]) -> None:
        self.file.truncate(0)
        write_sidecar(self.path, header)

    def cut(self, at: int) -> None:
        self.file.truncate(at)  # a torn last line, or a group cut short, goes
        self.file.seek(at)

    def write(self, text: str) -> None:
        """Whole lines, flushed together: a kill leaves at most one torn line, which resume
        drops."""
        self.file.write(text)
        self.file.flush()
        os.fsync(self.file.fileno())

    def finish(self, header: dict[str, Any]) -> None:
        """Nothing left to do: the sidecar was written when the output began."""

    def close(self) -> None:
        empty = self.created and os.fstat(self.file.fileno()).st_size == 0
        if empty:
            self.path.unlink(missing_ok=True)  # still ours: unlinked before the lock goes
            sidecar_of(self.path).unlink(missing_ok=True)
        self.file.close()


class ResumeRefused(ConfigError):
    """The output file was written by another scorer identity, or is not a managed-scorers
    output."""


@dataclass
class ResumePlan:
    """What an existing output holds: its header, how many leading input rows it covers, where to
    cut it."""

    header: dict[str, Any] | None = None
    done: int = 0
    truncate_at: int = 0
    # rows already written with an error, to score again
    retry: list[int] = field(default_factory=list)


def header_for(panel: RewardPanel, recipe: str, columns: Columns) -> dict[str, Any]:
    terms = {}
    for term in panel.terms:
        shape = component(term.backend).shape
        terms[term.name] = {
            "scorer": shape.name if shape else None,
            "revision": shape.revision if shape else None,
            "identity_hash": component(term.backend).identity_hash,
        }
    return {
        HEADER_KEY: FORMAT_VERSION,
        "identity_hash": panel.identity_hash,
        "terms": terms,
        "recipe": recipe,
        "columns": columns.record(),
    }


def read_output(path: Path) -> tuple[dict[str, Any], list[tuple[str, str, bool]], list[int]]:
    """(its sidecar's metadata, (id, input_sha, clean) per row, each row's end offset).

    A torn last row (a kill mid-write) is left out; an output with no managed-scorers sidecar beside
    it, or with anything that is not a row, is refused: it is not an output of this command."""
    not_ours = f"{path} is not an output of managed-scorers score"
    with open(path, "rb") as handle:
        data = handle.read()
    header = _sidecar(path, not_ours, data)
    lines = data.split(b"\n")
    complete, torn = lines[:-1], lines[-1]
    offset, rows, ends = 0, [], []
    for index, raw in enumerate(complete, start=1):
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as exc:
            # the last line, cut short before its newline was lost
            if index == len(complete) and not torn:
                break
            raise ResumeRefused(f"{path}:{index} is not JSON: {not_ours}") from exc
        if not isinstance(record, dict) or "id" not in record or "input_sha" not in record:
            raise ResumeRefused(f"{path}:{index} is not a row: {not_ours}")
        offset += len(raw) + 1
        clean = record.get("reward") is not None and not record.get("failed_terms")
        rows.append((str(record["id"]), str(record["input_sha"]), clean))
        ends.append(offset)
    return header, rows, ends


def _sidecar(path: Path, not_ours: str, data: bytes) -> dict[str, Any]:
    sidecar = sidecar_of(path)
    if not sidecar.is_file():
        if data.startswith(b'{"' + HEADER_KEY.encode()):
            raise ResumeRefused(
                f"{path} was written by an earlier managed-scorers (its metadata is its "
                f"first line, not {sidecar.name}): write to a new output"
            )
        raise ResumeRefused(f"{not_ours} (no {sidecar.name} beside it)")
    try:
        header = json.loads(sidecar.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ResumeRefused(f"{sidecar} is not JSON: {not_ours}") from exc
    if (
        not isinstance(header, dict)
        or header.get(HEADER_KEY) != FORMAT_VERSION
        or "identity_hash" not in header
    ):
        raise ResumeRefused(f"{sidecar} is not a managed-scorers sidecar: {not_ours}")
    return header


def plan_output(
    claim: Sink, rows: Sequence[Row], columns: Columns, resume: bool, retry_errors: bool = False
) -> ResumePlan:
    """Checked before any child starts: may this output be written, and from which input row on
    (stdout and Parquet outputs start new: `dataset_sinks`)."""
    output = claim.path
    if not isinstance(claim, OutputClaim) or os.fstat(claim.file.fileno()).st_size == 0:
        return ResumePlan()
    if not resume:
        raise ConfigError(
            f"{output} exists: pass --resume to continue it, or choose another output"
        )
    header, written, ends = read_output(output)
    if header.get("columns") != columns.record():
        raise ResumeRefused(
            f"{output} was written with columns {header.get('columns')}, not {columns.record()}"
        )
    if len(written) > len(rows):
        raise ResumeRefused(
            f"{output} holds {len(written)} rows, this input only {len(rows)}: another input"
        )
    for index, (row_id, sha, _) in enumerate(written):
        row = rows[index]
        if (row.id, row.digest) != (row_id, sha):
            raise ResumeRefused(
                f"{output} row {index + 1} ({row_id!r}) is not input line {row.line} "
                f"({row.id!r}) as it is now: "
                "the input changed, or is another one; write to a new output"
            )
    done = len(written)
    # never finish a group that a torn write cut short with fewer candidates
    if columns.group is not None:
        while 0 < done < len(rows) and group_of(rows[done - 1], columns) == group_of(
            rows[done], columns
        ):
            done -= 1
    retry: list[int] = []
    if retry_errors:  # rows written with an error or a failed term, each with its whole group
        failed = {
            group_of(rows[i], columns) or f"row:{rows[i].id}"
            for i in range(done)
            if not written[i][2]
        }
        retry = [
            i for i in range(done) if (group_of(rows[i], columns) or f"row:{rows[i].id}") in failed
        ]
    return ResumePlan(header, done, ends[done - 1] if done else 0, retry)


def check_resumable(old: dict[str, Any] | None, new: dict[str, Any], path: Path) -> None:
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
        f"{path} was scored by identity {old['identity_hash'][:12]}, this recipe is "
        f"{new['identity_hash'][:12]} "
        f"({'; '.join(changed) or 'weights, required flags or applicability changed'}): "
        f"write to a new output"
    )
