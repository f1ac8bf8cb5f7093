"""The outputs of `managed-scorers score` other than a JSONL file: stdout (`--output -`) and Parquet
(an output path ending in `.parquet`), and `open_output`, which picks one from the path.

Stdout gets the JSONL rows and nothing else: while the run lasts, file descriptor 1 points at
stderr, so what a child or an in-process scorer prints cannot land between rows; there is no sidecar
(the identity hash is said on stderr) and no resume. A Parquet output is written whole when the run
ends (one file, renamed into place, then its sidecar); the rows wait in an unnamed temporary file
beside it, so an interrupted run leaves nothing, and `--resume` is refused for it: score to JSONL
for a resumable run, and convert.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

from supervisor.errors import ConfigError
from supervisor.ops.dataset_output import OutputClaim, Sink, write_sidecar
from supervisor.ops.dataset_sources import STDIN, needs_extra

STDOUT = STDIN  # `-`


def refuse_unresumable(path: Path, resume: bool) -> None:
    """`--resume` refused, before anything is read, where the output cannot be continued."""
    if resume and path == STDOUT:
        raise ConfigError("--resume needs an output file: stdout (--output -) cannot be continued")
    if resume and path.suffix == ".parquet":
        raise ConfigError(
            f"--resume: {path} is Parquet, written whole when the run ends; score to JSONL "
            f"for a resumable run"
        )


def open_output(path: Path, resume: bool) -> Sink:
    """The sink `path` names, claimed for this run."""
    refuse_unresumable(path, resume)
    if path == STDOUT:
        return StdoutSink()
    if path.suffix == ".parquet":
        return ParquetSink(path)
    return OutputClaim(path)


class StdoutSink:
    """JSONL rows on the original stdout; fd 1 is stderr until `close`."""

    def __init__(self) -> None:
        self.path = STDOUT
        self.interrupted = (
            "stdout holds every row finished so far (no resume: write to a file for that)"
        )
        sys.stdout.flush()
        self._saved = os.dup(1)
        self.file: IO[str] = os.fdopen(os.dup(1), "w", encoding="utf-8")
        os.dup2(2, 1)  # a child's or a scorer's print goes to stderr, never between the rows

    def start(self, header: dict[str, Any]) -> None:
        print(
            f"scoring to stdout with identity {header['identity_hash']} (no sidecar)",
            file=sys.stderr,
        )

    def cut(self, at: int) -> None:
        raise ConfigError("stdout cannot be resumed")

    def write(self, text: str) -> None:
        try:
            self.file.write(text)
            self.file.flush()
        except BrokenPipeError as exc:
            raise ConfigError(
                "stdout was closed by its reader before every row was written"
            ) from exc

    def replace(self, content: str) -> None:
        raise ConfigError("stdout cannot be rewritten")

    def finish(self, header: dict[str, Any]) -> None:
        self.file.flush()

    def close(self) -> None:
        try:
            self.file.close()
        except BrokenPipeError:  # the reader left (`| head`): what it read is all it wanted
            pass
        sys.stdout.flush()
        os.dup2(self._saved, 1)
        os.close(self._saved)


class ParquetSink:
    """Rows collected in an unnamed temporary file, written as one Parquet file when the run
    ends."""

    def __init__(self, path: Path) -> None:
        needs_extra("parquet", "pyarrow", f"--output {path} (Parquet)")
        if not path.parent.is_dir():
            raise ConfigError(f"{path.parent} does not exist: create it, or choose another output")
        if path.exists() or path.is_symlink():
            raise ConfigError(
                f"{path} exists: choose another output (a Parquet output is never resumed)"
            )
        self.path = path
        self.interrupted = (
            f"nothing written to {path} (a Parquet output is written when the run ends)"
        )
        self.file: IO[str] = tempfile.TemporaryFile("w+", encoding="utf-8", dir=path.parent)

    def start(self, header: dict[str, Any]) -> None:
        self.file.truncate(0)

    def cut(self, at: int) -> None:
        raise ConfigError("a Parquet output cannot be resumed")

    def write(self, text: str) -> None:
        self.file.write(text)

    def replace(self, content: str) -> None:
        raise ConfigError("a Parquet output cannot be rewritten")

    def finish(self, header: dict[str, Any]) -> None:
        """The rows as one Parquet file: `components` a struct of each term's value, `failed_terms`
        one of each term's failure (null where none), so that pandas and `datasets` see one column
        per field."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.file.seek(0)
        rows = [json.loads(line) for line in self.file]
        terms = list(header["terms"])
        components = terms + sorted({k for r in rows for k in r["components"]} - set(terms))
        failed = terms + sorted({k for r in rows for k in r["failed_terms"]} - set(terms))
        schema = pa.schema(
            [
                ("id", pa.string()),
                ("reward", pa.float64()),
                ("components", pa.struct([(name, pa.float64()) for name in components])),
                ("failed_terms", pa.struct([(name, pa.string()) for name in failed])),
                ("error", pa.string()),
                ("input_sha", pa.string()),
            ]
        )
        table = pa.Table.from_pylist(rows, schema=schema)
        fd, temporary = tempfile.mkstemp(
            prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent
        )
        os.close(fd)
        try:
            pq.write_table(table, temporary)
            os.chmod(temporary, 0o644)
            if self.path.exists():
                raise ConfigError(
                    f"{self.path} was created by another run meanwhile: its rows are not replaced"
                )
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        write_sidecar(self.path, header)

    def close(self) -> None:
        self.file.close()
