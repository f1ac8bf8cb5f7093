"""`managed-scorers`: scorer envs, scoring a JSONL dataset, serving a scorer, checking a recipe, the demo.

Each subcommand is a thin layer over the library call that does the job; errors the user can
fix (a missing env, a misspelt scorer, an unknown param, a missing column) print one line naming
the file and line or the flag, and exit 2, never a traceback. The exit statuses are listed below.
"""  # noqa: E501 (its first line is the --help description, whole)

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

# first, for every command: supervisord's files in our `supervisor` package (scorers/install.py)
try:
    import scorers  # noqa: F401
except ImportError as _refusal:
    if not getattr(_refusal, "supervisord_clash", False):
        raise
    print(f"managed-scorers: {_refusal}", file=sys.stderr)
    raise SystemExit(2) from None

from pydantic import ValidationError

from supervisor import scorer_envs
from supervisor.errors import ConfigError, ScorerError, validation_message
from supervisor.ops import env_builder
from supervisor.ops.dataset_presets import PRESETS
from supervisor.ops.limits_coordinator import add_command as add_limits_coordinator

if TYPE_CHECKING:
    from supervisor.compose.recipes import Recipe
    from supervisor.config import ManagedScorerProcessSpec, PanelConfig
    from supervisor.ops.dataset_rows import Columns, Row
    from supervisor.ops.dataset_sources import Source
    from supervisor.ops.score_dataset import Summary

T = TypeVar("T")


def _envs_build(args: argparse.Namespace) -> int:
    def build(spec: Path, venv: Path) -> None:
        env_builder.build(
            spec, venv, args.python, args.force, installer=args.installer, verbosity=args.verbose
        )

    # a custom env (the repo's trainer env, say): explicit spec and folder
    if args.requirements is not None:
        if args.dir is None or len(args.names) != 1 or args.all:
            raise ConfigError("--requirements builds one env: give one NAME and --dir")
        build(args.requirements, args.dir)
        return 0
    if not args.names and not args.all:
        raise ConfigError(
            f"name the env(s) to build: {', '.join(scorer_envs.spec_names())}; or --all for "
            f"every one"
        )
    if args.names and args.all:
        raise ConfigError("--all builds every env: give no NAME with it")
    if args.dir is not None and len(args.names) != 1:
        raise ConfigError("--dir names the folder of one env: give one NAME")
    names = args.names or scorer_envs.spec_names()
    # unknown names fail before anything is built
    specs = [scorer_envs.spec_path(name) for name in names]
    for name, spec in zip(names, specs, strict=True):
        build(spec, args.dir if args.dir is not None else scorer_envs.env_dir(name, args.root))
    return 0


def _envs_remove(args: argparse.Namespace) -> int:
    env_builder.remove(args.name, args.root)
    return 0


def _envs_list(args: argparse.Namespace) -> int:
    print(f"scorer envs under {args.root or scorer_envs.envs_root()}")
    for name in scorer_envs.spec_names():
        status = env_builder.status(name, args.root)
        state = (
            "pins changed: rebuild"
            if status.pins_changed
            else "built"
            if status.built
            else "not built"
        )
        packages = "  ".join(f"{k}=={v or '?'}" for k, v in status.packages.items())
        python = (
            status.venv / "bin" / "python"
            if status.built
            else f"(managed-scorers envs build {name})"
        )
        version = f"  Python {status.python.version}" if status.python is not None else ""
        print(f"  {name:<6} {state:<22} {python}{version}  {packages}".rstrip())
    return 0


def _envs_path(args: argparse.Namespace) -> int:
    print(scorer_envs.env_python(args.name, args.root))
    return 0


def _folder(value: str) -> Path:
    return Path(value).expanduser().absolute()


def _score(args: argparse.Namespace) -> int:
    from supervisor.compose.recipes import load_recipe
    from supervisor.ops.dataset_sinks import STDOUT, refuse_unresumable
    from supervisor.ops.dataset_sources import source_of
    from supervisor.ops.score_dataset import metrics_line, tail_lines

    columns = _columns(args)
    refuse_unresumable(args.output, args.resume)
    source = source_of(args.input)
    recipe = load_recipe(args.recipe)
    chosen = _chosen_panel(args, recipe, columns)
    rows = _checked_rows(args, recipe, chosen, columns, source)
    name = "stdout" if args.output == STDOUT else args.output
    summary = _score_rows(args, recipe, rows, columns, source)
    if summary is None:
        return 130
    print(f"{name}: {summary.line()}", file=sys.stderr)
    metrics = metrics_line(summary, "val" if args.validation else "train")
    if metrics:
        print(f"diagnostics: {metrics}", file=sys.stderr)
    for line in tail_lines(summary):
        print(f"tail: {line}", file=sys.stderr)
    return 0 if summary.clean else 1


def _checked_rows(
    args: argparse.Namespace, recipe: Recipe, chosen: PanelConfig, columns: Columns, source: Source
) -> list[Row]:
    """The input's rows, read once the recipe and the columns pass what a child's boot would
    refuse, and checked in turn (ConfigError: any of them fails)."""
    from supervisor.ops import precheck
    from supervisor.ops.dataset_rows import read_rows

    # before any child starts
    # names, params, envs: what a child's boot would refuse
    report = precheck.check_recipe(recipe, args.recipe)
    place = "validation" if args.validation else "reward"
    # an image term without --image-column, before rows
    precheck.check_columns(chosen, place, report, columns)
    needs_text = args.image_column is None and args.audio_column is None
    try:
        rows = read_rows(source, columns, needs_text=needs_text, group_size=chosen.group_size)
    except OSError as exc:  # unreadable: the flag and the reason, not a traceback
        raise ConfigError(f"--input {args.input}: {exc.strerror or exc}") from exc
    precheck.check_rows(chosen, place, report, rows, columns, source.where)
    return rows


def _score_rows(
    args: argparse.Namespace, recipe: Recipe, rows: list[Row], columns: Columns, source: Source
) -> Summary | None:
    """Score the rows into --output with the recipe's panel, closed when done; None when Ctrl-C
    stopped it (what it leaves said on stderr)."""
    from supervisor.compose.recipes import build_panels, with_chunks_timed
    from supervisor.ops.dataset_output import header_for, plan_output
    from supervisor.ops.dataset_sinks import open_output
    from supervisor.ops.score_dataset import score_dataset

    with contextlib.ExitStack() as stack:
        # this run's alone until it ends: a second run is refused
        claim = open_output(args.output, args.resume)
        stack.callback(claim.close)
        # likewise: no boot wasted
        plan = plan_output(claim, rows, columns, args.resume, args.retry_errors)
        train, validation = build_panels(with_chunks_timed(recipe))
        panel = validation if args.validation and validation is not None else train
        stack.callback(train.close)
        if validation is not None:
            stack.callback(validation.close)
        header = header_for(panel, str(args.recipe), columns)
        try:
            return _with_progress_bars(
                lambda progress: score_dataset(
                    panel,
                    rows,
                    claim,
                    header,
                    columns,
                    source.base,
                    plan,
                    args.batch_size,
                    progress,
                )
            )
        except KeyboardInterrupt:
            print(f"interrupted: {claim.interrupted}", file=sys.stderr)
            return None


def _chosen_panel(args: argparse.Namespace, recipe: Any, columns: Columns) -> PanelConfig:
    """The panel this run scores with, once the flags agree with the recipe (ConfigError: they do
    not)."""
    if args.image_column is not None:  # the rows' images are read here, before any child starts
        _needs_extra("serving", "--image-column", ("PIL",))
    if args.retry_errors and not args.resume:
        raise ConfigError(
            "--retry-errors goes with --resume (it scores the error rows of an existing "
            "output again)"
        )
    if args.validation and recipe.validation is None:
        raise ConfigError(f"{args.recipe} has no validation panel (--validation)")
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1, got {args.batch_size}")
    chosen: PanelConfig = recipe.validation if args.validation else recipe.train
    if chosen.group_size is not None and columns.group is None:  # else every row fails in its child
        raise ConfigError(
            f"{args.recipe} declares groups of {chosen.group_size}: name each row's group "
            f"(--group-column)"
        )
    return chosen


def _columns(args: argparse.Namespace) -> Columns:
    from supervisor.ops.dataset_rows import columns_for

    return columns_for(
        args.preset,
        id=args.id_column,
        prompt=args.prompt_column,
        response=args.response_column,
        reference=args.reference_column,
        image=args.image_column,
        group=args.group_column,
        data_source=args.data_source_column,
        audio=args.audio_column,
    )


def _with_progress_bars(run: Callable[[Callable[[int, int], Callable[[int], None]]], T]) -> T:
    """`run(progress)`, where each `progress(total, skipped)` opens a tqdm bar (drawn on a terminal
    only) and returns its update; the bars are closed when `run` returns or is interrupted."""
    bars: list[Any] = []

    def progress(total: int, skipped: int) -> Callable[[int], None]:
        from tqdm import tqdm

        bar = tqdm(
            total=total,
            initial=skipped,
            unit="row",
            disable=not sys.stderr.isatty(),
            dynamic_ncols=True,
        )
        bars.append(bar)
        return bar.update

    try:
        result = run(progress)
    except KeyboardInterrupt:
        for bar in bars:
            bar.close()
        raise
    for bar in bars:
        bar.close()
    return result


OPENRLHF_PENDING_CONNECTIONS = 1024


def _serve(args: argparse.Namespace) -> int:
    from supervisor.ops import precheck
    from supervisor.ops.serve import read_secret, read_token, serve

    secret = None if args.openrlhf_secret_file is None else read_secret(args.openrlhf_secret_file)
    metrics = None if args.metrics_token_file is None else read_secret(args.metrics_token_file)
    unirl = None if args.unirl_secret_file is None else read_secret(args.unirl_secret_file)
    limits = _serve_limits(args, secret)
    if args.recipe is not None:
        _serve_recipe(args, limits, secret, metrics, unirl)
    kind = _served_kind(args, refuse_groupwise=secret is not None)
    spec = _served_spec(args, kind, limits)
    # name, params, env: here, not at the child's boot
    precheck.check_served(spec, f"--scorer {args.scorer}")
    token = read_token(args.token_env, args.token_file)
    serve(
        spec,
        args.host,
        args.port,
        token,
        args.allow_remote,
        args.token_env,
        secret,
        metrics,
        unirl,
    )


def _serve_limits(args: argparse.Namespace, secret: str | None) -> dict[str, int]:
    """The server's limits the flags set (the rest keep the config's defaults)."""
    # OpenRLHF opens a connection per sample, and a rollout's samples end in bursts: room for them
    pending = args.max_pending_connections or (
        OPENRLHF_PENDING_CONNECTIONS if secret is not None else None
    )
    limits: dict[str, int] = {} if pending is None else {"max_pending_connections": pending}
    if args.openrlhf_max_request_bytes is not None:
        limits["openrlhf_max_request_bytes"] = args.openrlhf_max_request_bytes
    if args.json_max_request_bytes is not None:
        limits["json_max_request_bytes"] = args.json_max_request_bytes
    return limits


def _serve_recipe(
    args: argparse.Namespace,
    limits: dict[str, int],
    secret: str | None,
    metrics: str | None,
    unirl: str | None,
) -> NoReturn:
    """`serve --recipe`: become the server of the recipe's panel (exec)."""
    from supervisor.ops.serve import panel_spec, read_token, serve

    _no_scorer_options(args)
    _needs_extra(
        "serving", "--recipe (the panel server runs in this python)", ("starlette", "uvicorn")
    )
    spec = panel_spec(args.recipe, limits)
    serve(
        spec,
        args.host,
        args.port,
        read_token(args.token_env, args.token_file),
        args.allow_remote,
        args.token_env,
        secret,
        metrics,
        unirl,
    )


def _served_spec(
    args: argparse.Namespace, kind: str | None, limits: dict[str, int]
) -> ManagedScorerProcessSpec:
    """The one scorer's child spec, from its flags (ConfigError: what the config models refuse)."""
    import json

    from supervisor.config import ManagedScorerProcessSpec

    try:
        params = json.loads(args.params)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--params must be a JSON object: {exc}") from exc
    scorer = {"name": args.scorer, "params": params, "device": args.device}
    scorer.update({} if kind is None else {"input_kind": kind})
    scorer.update(
        {k: v for k, v in (("revision", args.revision), ("catalog", args.catalog)) if v is not None}
    )
    process: dict[str, Any] = (
        {"python_executable": str(args.python)} if args.python is not None else {}
    )
    if args.extra_import_path:
        process["extra_import_paths"] = [str(path) for path in args.extra_import_path]
    try:
        return ManagedScorerProcessSpec.model_validate(
            {"env": args.env, "process": process, "scorer": scorer, "limits": limits}
        )
    except ValueError as exc:
        raise ConfigError(validation_message(exc)) from exc


def _needs_extra(extra: str, command: str, modules: tuple[str, ...]) -> None:
    """A command that needs an extra this install lacks: one line naming it (exit 2), not a
    traceback."""
    from scorers import install

    missing = install.missing_extra(extra, command, modules)
    if missing is not None:
        raise ConfigError(missing)


def _no_scorer_options(args: argparse.Namespace) -> None:
    """A recipe says where and how each term runs: one scorer's options would be silently
    ignored."""
    given = [
        f"--{name.replace('_', '-')}"
        for name in SCORER_OPTIONS
        if getattr(args, name) not in (None, [], "{}")
    ]
    if given:
        raise ConfigError(
            f"--recipe serves the recipe's panel: {', '.join(given)} belong to --scorer (set "
            f"them in the recipe)"
        )


SCORER_OPTIONS = (
    "params",
    "env",
    "python",
    "input_kind",
    "revision",
    "catalog",
    "extra_import_path",
)


def _served_kind(args: argparse.Namespace, refuse_groupwise: bool) -> str | None:
    """The scorer's input kind: --input-kind, else None where its class resolves here (ScorerConfig
    then takes the kind the class declares, as for a recipe's model); for the OpenRLHF route, a
    groupwise scorer refused here when its class imports in this env (else the server refuses it
    when it boots)."""
    from child_runtime.protocol.openrlhf import groupwise_refusal
    from scorers.registry import declared_spec, resolve_scorer
    from supervisor.ops.precheck import check_name

    # a misspelt name: the nearest, before the kind is asked for
    check_name(args.scorer, args.catalog)
    if args.input_kind is not None and not refuse_groupwise:
        # the class is not imported here (a user's module may not import in this env)
        return str(args.input_kind)
    try:
        resolve_scorer(args.scorer, args.catalog)
    except (LookupError, ImportError) as exc:
        if args.input_kind is None:
            raise ConfigError(
                f"cannot tell scorer {args.scorer!r}'s input kind here ({exc}): pass --input-kind"
            ) from exc
        return str(args.input_kind)
    # the same default a recipe's model gets (ScorerConfig)
    spec = declared_spec(args.scorer, args.catalog)
    if spec is None and args.input_kind is None:
        raise ConfigError(f"scorer {args.scorer!r} makes its spec per instance: pass --input-kind")
    if refuse_groupwise and spec is not None and spec.whole_groups:
        raise ConfigError(f"the OpenRLHF route refuses: {groupwise_refusal([spec.name])}")
    return None if args.input_kind is None else str(args.input_kind)


def _recipes(args: argparse.Namespace) -> int:
    from supervisor.ops.shipped_recipes import description, example_recipe, example_recipes

    if args.name is None:
        for name, path in example_recipes().items():
            print(f"{name:<16} {description(path)}")
        print("print one with `managed-scorers recipes NAME > reward.yaml`, then edit it")
        return 0
    sys.stdout.write(example_recipe(args.name).read_text())
    return 0


INTEGRATIONS = {"openrlhf": "supervisor.adapters.openrlhf"}  # a file the framework loads by path


def _integrations(args: argparse.Namespace) -> int:
    """The path of the file a framework loads by path (found, not imported: ops never drives an
    adapter)."""
    spec = importlib.util.find_spec(INTEGRATIONS[args.framework])
    if spec is None or spec.origin is None:
        raise ConfigError(f"{INTEGRATIONS[args.framework]} is not installed with this package")
    print(spec.origin)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from supervisor.ops import demo

    return demo.run(tour=args.tour, build=not args.no_build)


def _doctor(args: argparse.Namespace) -> int:
    from supervisor.ops.doctor import doctor

    def say(check: Any) -> None:
        print("\n".join(check.lines()), flush=True)

    healthy = doctor(args.recipe, say)
    print("all checks passed" if healthy else "some checks failed: see the fix lines above")
    return 0 if healthy else 1


EXIT_STATUS = (
    ("0", "done and clean; `serve`: stopped by SIGTERM or Ctrl-C, gracefully"),
    (
        "1",
        "done, but not clean (`score`: rows with an error or a failed optional term; "
        "`doctor`: a check failed), or a scorer failed (a child that would not boot or died: "
        "its log tail is printed)",
    ),
    (
        "2",
        "the configuration or the input is wrong, nothing was run: one line naming the file "
        "and line or the flag (an unknown flag or a missing argument: argparse's usage and "
        "error lines)",
    ),
    (
        "3",
        "`serve` only, the server could not boot: a bad boot config that only the scorer's "
        "env can see (params of a scorer this python cannot import; what this python can "
        "check exits 2 first)",
    ),
    ("4", "`serve` only: the scorer's module does not import in its env"),
    ("6", "`serve` only: the scorer's load() failed (weights, memory)"),
    ("130", "interrupted by Ctrl-C (`score` leaves an output that --resume finishes)"),
)
LOG_LEVELS = ("debug", "info", "warning", "error")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("managed-scorers")
    except PackageNotFoundError:  # a checkout on sys.path, never pip-installed: said, not guessed
        return "(not installed: run `pip install -e .`)"


def _epilog() -> str:
    import textwrap

    rows = [
        textwrap.fill(meaning, 78, initial_indent=f"  {code:>3}  ", subsequent_indent=" " * 7)
        for code, meaning in EXIT_STATUS
    ]
    return "\n".join(["exit status:", *rows])


def parser() -> argparse.ArgumentParser:
    """The whole command line: the top's options, then each sub-command in --help's order."""
    top = _top_parser()
    commands = top.add_subparsers(dest="command", required=True)
    _add_envs(commands)
    _add_score(commands)
    _add_serve(commands)
    add_limits_coordinator(commands)
    _add_recipes_and_integrations(commands)
    _add_doctor_and_demo(commands)
    return top


def _top_parser() -> argparse.ArgumentParser:
    """The program with its own options (--version, --log-level) and the exit statuses as its
    epilog."""
    top = argparse.ArgumentParser(
        prog="managed-scorers",
        description=__doc__.splitlines()[0],
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument(
        "--version",
        action="version",
        version=f"managed-scorers {_version()}",
        help="the installed distribution's version",
    )
    top.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="warning",
        help="the level of this process's own log lines on stderr (supervisor, scorers: "
        "restarts, retries, timeouts); children log to their own files, and other libraries "
        "stay at warning",
    )
    return top


def _add_recipes_and_integrations(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    examples = commands.add_parser(
        "recipes", help="the example recipes that ship with the package: list, or print one"
    )
    examples.add_argument(
        "name", nargs="?", metavar="NAME", help="print this one (a YAML recipe to start from)"
    )
    examples.set_defaults(run=_recipes)
    integrations = commands.add_parser(
        "integrations", help="the file a framework loads by path (OpenRLHF's reward_func)"
    )
    integrations.add_argument("framework", choices=sorted(INTEGRATIONS))
    integrations.set_defaults(run=_integrations)


def _add_doctor_and_demo(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    checkup = commands.add_parser(
        "doctor", help="check a recipe end to end: envs, boot, one sample, shared memory"
    )
    checkup.add_argument("recipe", type=_folder, help="a reward recipe (YAML)")
    checkup.set_defaults(run=_doctor)
    show = commands.add_parser(
        "demo",
        help="a math grader in a managed child and in this process (hydra's antlr pin); builds "
        "the math env",
    )
    show.add_argument(
        "--tour",
        action="store_true",
        help="add the image, OCR and MiniLM (torch) envs, a GRPO panel",
    )
    show.add_argument(
        "--no-build", action="store_true", help="build no env: name the command that would (exit 2)"
    )
    show.set_defaults(run=_demo)


def _add_envs(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    envs = commands.add_parser(
        "envs", help="scorer envs: build, list, path, remove"
    ).add_subparsers(dest="envs_command", required=True)
    root_help = (
        f"where envs live (default ${scorer_envs.ROOT_VARIABLE}, else "
        f"~/.local/share/managed-scorers/envs)"
    )
    _add_envs_build(envs, root_help)
    listing = envs.add_parser(
        "list", help="each env: built or not, its python, key package versions"
    )
    listing.add_argument("--root", type=_folder, help=root_help)
    listing.set_defaults(run=_envs_list)
    path = envs.add_parser("path", help="the python of a built env")
    path.add_argument("name", metavar="NAME")
    path.add_argument("--root", type=_folder, help=root_help)
    path.set_defaults(run=_envs_path)
    remove = envs.add_parser(
        "remove", help="remove a built env (ROOT/NAME/.venv, only one this builder made)"
    )
    remove.add_argument("name", metavar="NAME")
    remove.add_argument("--root", type=_folder, help=root_help)
    remove.set_defaults(run=_envs_remove)


def _add_envs_build(
    envs: argparse._SubParsersAction[argparse.ArgumentParser], root_help: str
) -> None:
    """`envs build`: which envs, and where (its interpreter and installer: `_add_build_tools`)."""
    build = envs.add_parser(
        "build",
        help="build scorer envs, only if their pins or their interpreter changed (progress on "
        "stderr)",
    )
    build.add_argument(
        "names", nargs="*", metavar="NAME", help=f"one of {', '.join(scorer_envs.spec_names())}"
    )
    build.add_argument(
        "--all", action="store_true", help="build every env the package has a spec for (torch too)"
    )
    build.add_argument("--root", type=_folder, help=root_help)
    build.add_argument(
        "--dir", type=_folder, help="the venv folder of this one env (instead of ROOT/NAME/.venv)"
    )
    build.add_argument(
        "--requirements", type=_folder, help="build from this requirements file instead of a spec"
    )
    _add_build_tools(build)
    build.set_defaults(run=_envs_build)


def _add_build_tools(build: argparse.ArgumentParser) -> None:
    """`envs build`'s interpreter, installer and their output."""
    build.add_argument(
        "--python",
        help="the interpreter that makes the venv (default: the one it was built with, else this "
        "one's base); another one than it was built with rebuilds it",
    )
    build.add_argument(
        "--force", action="store_true", help="rebuild even when the pins did not change"
    )
    build.add_argument(
        "--installer",
        choices=env_builder.INSTALLERS,
        default="pip",
        help="pip (default), or uv where it is installed; pip's config (index, constraints) "
        "applies either way",
    )
    build.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="pass the installer's output on (-vv: its verbose output)",
    )


def _add_score(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    score = commands.add_parser(
        "score",
        help="score a dataset (JSONL, JSON, Parquet, a save_to_disk folder) through a recipe's "
        "panel into JSONL or Parquet",
        description="Score a dataset through a recipe's panel: one output record per input row, "
        "in input order. A column may be a dotted path into nested records "
        "(reward_model.ground_truth). A prompt or a completion stored as chat messages is "
        "scored as text: the completion's last assistant message's content, the prompt's "
        "last message's content (a scorer never sees the whole conversation: render it to "
        "one string column for that). The run's metadata (identity hash, terms, revisions) "
        "goes to OUTPUT.meta.json.",
    )
    score.add_argument(
        "--recipe",
        type=_folder,
        required=True,
        help="a reward recipe (YAML), see supervisor.compose.recipes",
    )
    score.add_argument(
        "--input",
        type=_path_or_dash,
        required=True,
        help="JSONL (- reads it from stdin); .json: a list of records (or JSONL); .parquet (the "
        "'parquet' extra); a folder written by datasets' save_to_disk (the 'datasets' extra)",
    )
    score.add_argument(
        "--output",
        type=_path_or_dash,
        required=True,
        help="JSONL, one record per input row, its metadata in OUTPUT.meta.json; - writes the "
        "JSONL to stdout (nothing else goes there); .parquet: written whole when the run "
        "ends (the 'parquet' extra)",
    )
    score.add_argument(
        "--resume",
        action="store_true",
        help="keep the rows already in --output (a JSONL file), score the rest",
    )
    score.add_argument(
        "--retry-errors",
        action="store_true",
        help="with --resume: score rows written with errors again",
    )
    score.add_argument(
        "--validation", action="store_true", help="use the recipe's validation panel"
    )
    score.add_argument("--batch-size", type=int, default=64, help="rows per request (whole groups)")
    _add_columns(score)
    score.set_defaults(run=_score)


def _add_columns(score: argparse.ArgumentParser) -> None:
    score.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="the frameworks' column names in one flag (a column flag still overrides): "
        + "; ".join(
            f"{name}: " + ", ".join(f"{k}={v}" for k, v in cols.items())
            for name, cols in PRESETS.items()
        ),
    )
    score.add_argument(
        "--id-column", help="default: id (else line-N, or row-N for the other forms)"
    )
    score.add_argument(
        "--prompt-column",
        help="default: prompt; a string, or chat messages (their last message's content)",
    )
    score.add_argument(
        "--response-column",
        help="default: response; a string, a one-element list of one, or chat messages: the text "
        "scored is the last assistant message's content (a scorer never sees the whole "
        "conversation: render it to a string column for that)",
    )
    score.add_argument(
        "--reference-column",
        help="default: reference; any column may be a dotted path (reward_model.ground_truth)",
    )
    score.add_argument("--image-column", help="a column of image paths, relative to the input file")
    score.add_argument(
        "--audio-column",
        help="a column of WAV paths (PCM or IEEE float), relative to the input file",
    )
    score.add_argument(
        "--group-column", help="rows of one group share this value (and sit together)"
    )
    score.add_argument("--data-source-column", help="default: data_source")


def _path_or_dash(value: str) -> Path:
    """`-` (stdin or stdout) as it is; any other path made absolute."""
    return Path("-") if value == "-" else _folder(value)


def _add_serve(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    server = commands.add_parser(
        "serve",
        help="serve one scorer, or a recipe's whole panel, over HTTP for RemoteRewardBackend "
        "(until SIGTERM)",
    )
    what = server.add_mutually_exclusive_group(required=True)
    what.add_argument("--scorer", help="a built-in name, a catalog name or module:Class")
    what.add_argument(
        "--recipe",
        type=_folder,
        help="a reward recipe (YAML): serve its training panel, every term",
    )
    server.add_argument("--params", default="{}", help="the scorer's params, a JSON object")
    where = server.add_mutually_exclusive_group()
    where.add_argument("--env", help="a scorer env by name (default: the one the scorer declares)")
    where.add_argument("--python", type=_folder, help="the scorer env's python, by path")
    _add_listening(server)
    server.add_argument("--input-kind", choices=["text", "image", "image_edit", "video", "audio"])
    server.add_argument("--device", default="cpu")
    server.add_argument("--revision", help="a pin: refuse to serve another revision of the scorer")
    server.add_argument("--catalog", help="a custom catalog factory, module:name")
    server.add_argument(
        "--extra-import-path", type=_folder, action="append", help="a folder of your scorer modules"
    )
    _add_openrlhf(server)
    _add_json_and_metrics(server)
    server.add_argument(
        "--max-pending-connections",
        type=int,
        help=f"connections that have not yet sent an authenticated request (default 64; "
        f"{OPENRLHF_PENDING_CONNECTIONS} "
        "with the OpenRLHF route: a connection per sample); more are refused with a 503",
    )
    server.set_defaults(run=_serve)


def _add_listening(server: argparse.ArgumentParser) -> None:
    """Where `serve` listens and the token that guards it."""
    server.add_argument(
        "--host", default="127.0.0.1", help="default 127.0.0.1; others need --allow-remote"
    )
    server.add_argument(
        "--port", type=int, default=0, help="default 0: any free port (printed when ready)"
    )
    server.add_argument(
        "--token-env", default="MANAGED_SCORERS_TOKEN", help="the variable holding the token"
    )
    server.add_argument(
        "--token-file", type=_folder, help="a 0600 file holding the token (made if missing)"
    )
    server.add_argument(
        "--allow-remote", action="store_true", help="listen on a non-loopback address"
    )


def _add_openrlhf(server: argparse.ArgumentParser) -> None:
    """The OpenRLHF route: its secret and its body cap."""
    server.add_argument(
        "--openrlhf-secret-file",
        type=_folder,
        help="also serve OpenRLHF's --reward.remote_url at /openrlhf/<the secret in this 0600 "
        "file> (made if missing)",
    )
    server.add_argument(
        "--openrlhf-max-request-bytes",
        type=int,
        help="the OpenRLHF route's body cap (default 16 MiB: one sample of a 128k-token context; "
        "its JSON parse may take 4x this); a larger body is refused with a 413 before it is read",
    )


def _add_json_and_metrics(server: argparse.ArgumentParser) -> None:
    server.add_argument(
        "--unirl-secret-file",
        type=_folder,
        help="also serve UniRL's own RemoteRewardBackend at base_url http://HOST:PORT/unirl/<the "
        "secret in this 0600 file> (made if missing): its /health and /score, no header",
    )
    server.add_argument(
        "--json-max-request-bytes",
        type=int,
        help="the body cap of /score's JSON form (UniRL's protocol, base64 images; default 128 "
        "MiB: a 64-image shard of 1024x1024 JPEGs); a larger body is refused with a 413 "
        "before it is read",
    )
    server.add_argument(
        "--metrics-token-file",
        type=_folder,
        help="a second token, in this 0600 file (made if missing), that opens GET /metrics only: "
        "for a Prometheus scrape (authorization credentials_file) that must not hold the "
        "scoring token",
    )


def _logging(level: str) -> None:
    """Our packages' loggers at `level`, everything else at warning, one stderr handler for both."""
    logging.basicConfig(
        level=logging.WARNING, format="managed-scorers %(levelname)s %(name)s: %(message)s"
    )
    for package in ("supervisor", "scorers", "child_runtime"):
        logging.getLogger(package).setLevel(level.upper())


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    _logging(args.log_level)
    try:
        return int(args.run(args))
    except (ConfigError, ScorerError) as exc:
        print(f"managed-scorers {args.command}: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
    # a config model refused something no caller translated: still one line
    except ValidationError as exc:
        print(f"managed-scorers {args.command}: {validation_message(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # `score` says what it leaves itself; every other command just stops
        print(f"managed-scorers {args.command}: interrupted", file=sys.stderr)
        return 130
