"""What `score` and `serve` check in this process before any child starts, so that a mistake the
parent can see is one line and exit 2 rather than a child's boot failure (exit 1 or 3) or a 422 per
row.

`preflight` resolves every scorer here and builds it with its params (an unknown name gets the
nearest registered one, an unknown param the valid ones); `score` then holds each row against
the fields its terms' scorers require (`ScorerSpec.required_fields` and the completion of their
input kind), naming the file, the line and the column flag. A scorer only its env can import is
left to its child, which refuses a bad config at boot with its own exit code (3).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from scorers.base import ScorerSpec
from scorers.registry import UnknownScorerError, resolve_scorer
from supervisor.compose.recipe_lines import line_of_term
from supervisor.compose.recipes import Recipe
from supervisor.config import BackendConfig, PanelConfig, TermConfig
from supervisor.errors import ConfigError
from supervisor.ops.dataset_rows import Columns, InputRowError, Row, _item
from supervisor.ops.preflight import PreflightReport, check_backend, preflight

# an item's field -> (the Columns attribute that fills it, the flag that names that column)
TEXT_FIELDS = {
    "text": ("response", "--response-column"),
    "prompt": ("prompt", "--prompt-column"),
    "reference": ("reference", "--reference-column"),
}
MEDIA_FIELDS = {"image": "--image-column", "audio": "--audio-column"}
COMPLETION = {
    "text": "text",
    "image": "image",
    "image_edit": "image",
    "video": "video",
    "audio": "audio",
}


def check_recipe(recipe: Recipe, path: Path) -> PreflightReport:
    """Every term of the recipe's panels resolved and built here; a ConfigError naming the file and
    each problem's term on one line, else the report (its `specs` by place, e.g.
    `reward.correct`)."""
    report = preflight(recipe, raise_on_problems=False)
    if report.problems:
        raise ConfigError(_located(path, report.problems))
    return report


def _located(path: Path, problems: list[str]) -> str:
    """`file:line: problem`, the line of the first problem's term; with several, each says its
    own."""
    try:
        text = path.read_text()
    # read a moment ago by load_recipe: gone now, it has no lines
    except (OSError, UnicodeDecodeError):
        text = ""
    lines = [line_of_term(text, problem.partition(":")[0]) for problem in problems]
    head = f"{path}:{lines[0]}" if lines[0] is not None else str(path)
    rest = [
        f"{problem} (line {line})" if line is not None else problem
        for problem, line in zip(problems, lines, strict=True)
    ]
    return f"{head}: {'; '.join([problems[0], *rest[1:]])}"


def check_served(spec: BackendConfig, place: str) -> None:
    """`serve --scorer`'s spec, checked as a recipe's term would be; its problems named by
    `place`."""
    report = check_backend(spec, place)
    if report.problems:
        raise ConfigError("; ".join(report.problems))


def check_name(name: str, catalog: str | None) -> None:
    """A plain name (not a module path) that resolves to nothing is misspelt: said with the
    nearest."""
    if any(mark in name for mark in ".:"):
        return
    try:
        resolve_scorer(name, catalog)
    # a CatalogError may be a catalog only the env imports: its child says
    except UnknownScorerError as exc:
        raise ConfigError(str(exc)) from exc


def _term_fields(
    panel: PanelConfig, where: str, report: PreflightReport
) -> Iterator[tuple[TermConfig, ScorerSpec, str]]:
    """Each term checked here, with its scorer's spec, and each field that scorer needs of an item;
    a remote term, or a scorer only its env imports, is left to its server or child."""
    for term in panel.terms:
        spec = report.specs.get(f"{where}.{term.name}")
        if spec is not None:
            yield from ((term, spec, field) for field in _needed(spec))


def check_columns(
    panel: PanelConfig, where: str, report: PreflightReport, columns: Columns
) -> None:
    """Each term whose scorer reads media has its column flag (`--image-column`, ...): said before
    any row is read, so a row is never blamed for lacking a text the scorer does not read."""
    for term, spec, field in _term_fields(panel, where, report):
        if field in MEDIA_FIELDS or field == "video":
            _check_media_column(field, columns, spec, term.name)


def check_rows(
    panel: PanelConfig,
    where: str,
    report: PreflightReport,
    rows: Sequence[Row],
    columns: Columns,
    at: Callable[[int], str],
) -> None:
    """Each row holds the texts each term's scorer requires (a term applies to the rows of its
    datasets only; media are check_columns'); InputRowError naming the row (`at(row.line)`:
    `file:line`) and the column's flag for the first row that does not. `where` is the panel's
    place: `reward` or `validation`."""
    items = [_item(row, columns) for row in rows]
    for term, spec, field in _term_fields(panel, where, report):
        if field not in TEXT_FIELDS:
            # media: check_columns; no column of `score` fills it (condition_images): its child says
            continue
        attribute, flag = TEXT_FIELDS[field]
        for row, item in zip(rows, items, strict=True):
            applies = (
                term.applicable_datasets is None or item.data_source in term.applicable_datasets
            )
            if applies and getattr(item, field) is None:
                raise InputRowError(
                    f"{at(row.line)}: no {field} in column {getattr(columns, attribute)!r} "
                    f"({flag}): term {term.name!r} (scorer {spec.name!r}) requires it"
                )


def _needed(spec: ScorerSpec) -> list[str]:
    return list(dict.fromkeys([COMPLETION.get(spec.input_kind, "text"), *spec.required_fields]))


def _check_media_column(field: str, columns: Columns, spec: ScorerSpec, term: str) -> None:
    if field == "video":
        raise ConfigError(
            f"term {term!r} (scorer {spec.name!r}) scores video: `score` reads no video column"
        )
    if getattr(columns, field) is None:
        raise ConfigError(
            f"term {term!r} (scorer {spec.name!r}) needs the {field} of each row: pass "
            f"{MEDIA_FIELDS[field]}"
        )
