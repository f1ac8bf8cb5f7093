"""The reference pages, generated from the code at build time (mkdocs-gen-files runs this file).

- reference/cli.md: the CLI's argparse parser, walked subcommand by subcommand;
- reference/config.md: the pydantic config models (fields, types, defaults, constraints, the
  comments the code gives them), walked from the recipe's root models through every nested one,
  plus the keys each recipe style reads (the constants its parser checks against);
- reference/http.md: the child's (and `serve`'s) routes, read from a real app over an in-process
  scorer and called once each, plus the error kinds its handlers answer (read from the source);
- reference/scorers.md: the scorer registry: each name, input kind, params, env.

Nothing here is written by hand: a field, an option or a route that changes changes its page.
Nothing starts a child: the app is built over the `constant` scorer in this process.

Preview without mkdocs: `python docs/gen_reference.py OUT_DIR` writes the pages under OUT_DIR.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import io
import json
import sys
import textwrap
import tokenize
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

WIDTH = 100  # the usage lines' width: the same on every machine


# --- markdown helpers -------------------------------------------------------------------------


def cell(text: object) -> str:
    """Plain text for a table cell: one line, no pipes, no raw HTML."""
    flat = " ".join(str(text).split())
    return flat.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")


def code(text: object) -> str:
    """A code span for a table cell (backticks inside are doubled around)."""
    flat = " ".join(str(text).split()).replace("|", "\\|")
    return f"`` {flat} ``" if "`" in flat else f"`{flat}`"


def doc(obj: Any) -> str:
    return inspect.cleandoc(obj.__doc__) if obj.__doc__ else ""


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


GENERATED = "*Generated from the code by `docs/gen_reference.py` at build time; do not edit.*"


# --- the CLI -----------------------------------------------------------------------------------


def _subcommands(
    parser: argparse.ArgumentParser,
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help, parser) of each subcommand, in the parser's order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _option_rows(parser: argparse.ArgumentParser) -> list[list[str]]:
    formatter = argparse.HelpFormatter(parser.prog, width=WIDTH)
    exclusive = {}
    for group in parser._mutually_exclusive_groups:
        names = ", ".join(a.option_strings[0] for a in group._group_actions if a.option_strings)
        for action in group._group_actions:
            exclusive[id(action)] = (
                "exactly one of " if group.required else "at most one of "
            ) + names
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        name = ", ".join(action.option_strings) or (action.metavar or action.dest)
        value = "" if action.nargs == 0 else (action.metavar or action.dest.upper())
        shown = f"{name} {value}".strip() if action.option_strings else str(name)
        if action.nargs in ("*", "+"):
            shown += " ..."
        help_text = formatter._expand_help(action) if action.help else ""
        notes = []
        if action.choices and not isinstance(action.choices, dict):
            notes.append("one of " + ", ".join(f"`{c}`" for c in action.choices))
        if action.nargs == "*":
            notes.append("zero or more")
        elif action.required:
            notes.append("required")
        if id(action) in exclusive:
            notes.append(exclusive[id(action)])
        if action.nargs == "?":
            notes.append("optional")
        if isinstance(action, argparse._AppendAction):
            notes.append("repeatable")
        default = action.default
        # 0 is a default to show
        hidden = default is None or default is False or default == argparse.SUPPRESS
        shown_default = "" if hidden or action.nargs in ("*", "+") else default
        rows.append(
            [
                code(shown),
                cell(help_text)
                + ("" if not notes else (" (" if help_text else "(") + "; ".join(notes) + ")"),
                code(shown_default) if shown_default != "" else "",
            ]
        )
    return rows


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def cli_page() -> str:
    from supervisor.ops import cli

    top = cli.parser()
    lines = [
        "# CLI: managed-scorers",
        "",
        GENERATED,
        "",
        doc(cli),
        "",
        "```text",
        _usage(top),
        "```",
        "",
    ]
    lines.extend(
        table(
            ["Global option (before the subcommand)", "What it does", "Default"], _option_rows(top)
        )
    )
    if top.epilog:  # the exit statuses, as `--help` ends with them
        lines.extend(["```text", top.epilog, "```", ""])

    def walk(parser: argparse.ArgumentParser, path: list[str], help_text: str) -> None:
        subs = list(_subcommands(parser))
        lines.extend([f"{'#' * min(len(path), 4)} {' '.join(path)}", ""])
        if help_text:
            lines.extend([help_text[:1].upper() + help_text[1:] + ".", ""])
        lines.extend(["```text", _usage(parser), "```", ""])
        rows = _option_rows(parser)
        if rows:
            lines.extend(table(["Argument", "What it does", "Default"], rows))
        for name, sub_help, sub in subs:
            walk(sub, [*path, name], sub_help)

    for name, help_text, sub in _subcommands(top):
        walk(sub, ["managed-scorers", name], help_text)
    return "\n".join(lines)


# --- config models -----------------------------------------------------------------------------


def type_text(annotation: Any, link: Callable[[type], str]) -> str:
    """A readable type: models linked, Literals as their values, Annotated stripped."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is type(None):
        return "None"
    if origin is typing.Annotated:
        return type_text(args[0], link)
    if origin is typing.Literal:
        return " \\| ".join(f"`{json.dumps(a)}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(type_text(a, link) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(type_text(a, link) for a in args)}]"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return link(annotation)
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def nested_models(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from nested_models(arg)


def field_comments(model: type[BaseModel]) -> dict[str, str]:
    """Each field's comments in the class source: the lines just above it and its trailing
    comment."""
    try:
        source = textwrap.dedent(inspect.getsource(model))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    trailing = _comments_by_line(source)
    found = {}
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    for node in body.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above = []
            number = node.lineno - 1
            while number >= 1 and lines[number - 1].strip().startswith("#"):
                above.insert(0, lines[number - 1].strip().lstrip("#").strip())
                number -= 1
            own = [
                trailing[n]
                for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)
                if n in trailing
            ]
            text = " ".join([*above, *own])
            if text:
                found[node.target.id] = text.replace("noqa", "").strip()
    return found


def constraints(info: FieldInfo) -> str:
    said = []
    symbols = {
        "gt": ">",
        "ge": ">=",
        "lt": "<",
        "le": "<=",
        "min_length": "min length",
        "max_length": "max length",
    }
    for meta in info.metadata:
        for attr, symbol in symbols.items():
            value = getattr(meta, attr, None)
            if value is not None and isinstance(meta, annotated_types.BaseMetadata):
                said.append(f"{symbol} {value}")
        pattern = getattr(meta, "pattern", None)
        if pattern is not None:
            said.append(f"matches `{pattern}`")
    return ", ".join(said)


def default_text(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return "its defaults"
        return code(json.dumps(value))
    if info.default is PydanticUndefined:
        return ""
    value = info.default
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1 << 20:
        return code(value)
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value >= 1 << 20
        and value % (1 << 20) == 0
    ):
        return f"{code(value)} ({value >> 20} MiB)"
    try:
        return code(json.dumps(value))
    except TypeError:
        return code(repr(value))


def anchor(model: type[BaseModel]) -> str:
    return model.__name__.lower()


def model_section(model: type[BaseModel], level: str = "###") -> list[str]:
    comments = field_comments(model)
    where = f"{model.__module__}.{model.__qualname__}"
    lines = [f"{level} {model.__name__}", "", f"`{where}`", ""]
    if doc(model):
        lines.extend([doc(model), ""])
    rows = []
    for name, info in model.model_fields.items():
        said = info.description or comments.get(name, "")
        rule = constraints(info)
        rows.append(
            [
                code(name),
                type_text(info.annotation, lambda m: f"[{m.__name__}](#{anchor(m)})"),
                default_text(info),
                cell(rule),
                cell(said),
            ]
        )
    if model.model_config.get("extra") == "forbid":
        lines.extend(["Unknown keys are refused.", ""])
    lines.extend(table(["Field", "Type", "Default", "Constraint", "Notes"], rows))
    return lines


def walk_models(roots: list[type[BaseModel]]) -> list[type[BaseModel]]:
    """Each root, then every model its fields hold (breadth first), before the next root; each
    once."""
    seen: list[type[BaseModel]] = []
    for root in roots:
        queue = [root]
        while queue:
            model = queue.pop(0)
            if model in seen:
                continue
            seen.append(model)
            for info in model.model_fields.values():
                queue.extend(nested_models(info.annotation))
    return seen


def recipe_keys() -> list[str]:
    """The keys each recipe style reads: the sets its parser checks entries against."""
    from supervisor.compose import engine_recipe, ff_recipe, model_keys, native_recipe, recipes

    styles = [
        (recipes, "verl-omni `reward.models.NAME` (a managed or local model)", "MODEL_KEYS"),
        (recipes, "verl-omni `reward.models.NAME` with `backend: remote`", "REMOTE_KEYS"),
        (native_recipe, "verl-omni native model (`backend: native`)", "MODEL_KEYS"),
        (engine_recipe, "verl-omni engine model (`backend: engine`)", "MODEL_KEYS"),
        (
            engine_recipe,
            "verl-omni engine model's `rollout` (the default vLLM command)",
            "ROLLOUT_KEYS",
        ),
        (
            model_keys,
            "verl-omni reward function bound to a native or engine model: the panel's keys",
            "TERM_KEYS",
        ),
        (
            model_keys,
            "verl-omni reward function bound to a native or engine model: the binding",
            "FUNCTION_KEYS",
        ),
        (ff_recipe, "FF `rewards:` entry: the term", "TERM_KEYS"),
        (ff_recipe, "FF `rewards:` entry: where it runs", "PLACE_KEYS"),
        (ff_recipe, "FF `rewards:` entry: the model's own", "MODEL_KEYS"),
    ]
    rows = [
        [
            cell(what),
            code(f"{module.__name__}.{name}"),
            ", ".join(f"`{k}`" for k in sorted(getattr(module, name))),
        ]
        for module, what, name in styles
    ]
    parse = inspect.getsource(recipes._parse)
    return [
        "## Recipe styles",
        "",
        doc(recipes),
        "",
        "`load_recipe` tells the style by the top-level keys, in this order (from `_parse`):",
        "",
        "```python",
        textwrap.dedent(parse).strip(),
        "```",
        "",
        "The keys each style's entries may carry (any other key is refused, except in FF "
        "entries, where",
        "it goes to the model's `extra_kwargs`):",
        "",
        *table(["Entry", "Checked against", "Keys"], rows),
    ]


def config_page() -> str:
    from supervisor import config, types
    from supervisor.compose import ray_pool

    roots: list[type[BaseModel]] = [config.PanelConfig]
    roots += [
        value
        for value in vars(config).values()
        if isinstance(value, type)
        and issubclass(value, BaseModel)
        and value.__module__ == config.__name__
    ]
    models = [m for m in walk_models(roots) if not m.__name__.startswith("_")]
    lines = ["# Recipe and config fields", "", GENERATED, "", doc(config), ""]
    lines += [
        "A `terms:` recipe is a `PanelConfig` as YAML; the other styles are translated into one "
        "(see [Recipe styles](#recipe-styles)). Each term's `backend` is one of the four backend "
        "configs, told apart by `kind` (no `kind`: `managed` when it has `process`, else `local`).",
        "",
        "## Panel and backend configs",
        "",
    ]
    for model in models:
        lines.extend(model_section(model))
    lines.extend(recipe_keys())
    lines.extend(["## Ray pool", ""])
    lines.extend(model_section(ray_pool.RayPoolConfig))
    lines.extend(["## Request and response types", "", doc(types).split("\n\n")[0], ""])
    for model in walk_models([types.RewardRequest, types.RewardResponse]):
        lines.extend(model_section(model))
    return "\n".join(lines)


# --- the HTTP surface --------------------------------------------------------------------------

TOKEN = "reference-page-token"
SECRET = "reference-page-secret-0123456789"


def _handler_of(endpoint: Any, owner: type) -> Any:
    """The `owner` method a route's endpoint wraps (through the closures of its guards)."""
    queue, seen = [endpoint], set()
    while queue:
        fn = queue.pop(0)
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        if inspect.ismethod(fn) and isinstance(fn.__self__, owner):
            return fn
        for cell_ in getattr(fn, "__closure__", None) or ():
            try:
                queue.append(cell_.cell_contents)
            except ValueError:
                continue
    raise LookupError(f"no {owner.__name__} method behind {endpoint!r}")


def _live_answers(app: Any) -> dict[str, Any]:
    """Each route called once over the real app (in this process, through httpx's ASGI transport):
    what it answers."""
    import asyncio

    import httpx

    from child_runtime.protocol import wire
    from child_runtime.protocol.openrlhf import ROUTE
    from child_runtime.protocol.unirl import ROUTE as UNIRL_ROUTE

    auth = {"authorization": f"Bearer {TOKEN}"}
    frame = wire.encode(
        {"items": [{"id": "a", "text": "an answer"}, {"id": "b", "text": "another"}]}
    )
    unirl = {
        "protocol_version": "1",
        "requests": [{"history": [{"text": "an answer"}], "request_id": "a"}],
    }
    one_sample = {"query": ["What is 2+2? 4"], "prompts": ["What is 2+2?"], "labels": ["4"]}

    async def call_all() -> dict[str, httpx.Response]:
        transport = httpx.ASGITransport(app=app)  # no lifespan: the child serves none
        async with httpx.AsyncClient(transport=transport, base_url="http://child") as client:
            return {
                "/health": await client.get("/health", headers=auth),
                "/metrics": await client.get("/metrics", headers=auth),
                "/livez": await client.get("/livez"),
                "/score": await client.post(
                    "/score", content=frame, headers={**auth, "content-type": wire.CONTENT_TYPE}
                ),
                "/score json": await client.post("/score", json=unirl, headers=auth),
                "/onload": await client.post("/onload", headers=auth),
                "/offload": await client.post("/offload", headers=auth),
                "/drain": await client.post("/drain", headers=auth),
                ROUTE: await client.post(f"{ROUTE}/{SECRET}", json=one_sample),
                f"{UNIRL_ROUTE}/health": await client.get(f"{UNIRL_ROUTE}/{SECRET}/health"),
                f"{UNIRL_ROUTE}/score": await client.post(
                    f"{UNIRL_ROUTE}/{SECRET}/score", json=unirl
                ),
                "/shutdown": await client.post("/shutdown", headers=auth),
                "401": await client.get("/health"),
            }

    answers: dict[str, Any] = {}
    for path, response in asyncio.run(call_all()).items():
        kind = response.headers.get("content-type", "")
        if kind.startswith("application/json"):
            body: Any = response.json()
        elif kind.startswith(wire.CONTENT_TYPE):
            body = wire.decode(response.content)
        else:
            body = response.text
        if path != "401" and response.status_code >= 400:
            raise RuntimeError(f"{path} answered {response.status_code}: {body}")
        answers[path] = (response.status_code, kind, body, dict(response.headers))
    return answers


def _json_score_section(answer: tuple[int, str, Any, dict[str, str]]) -> list[str]:
    """/score's JSON form: UniRL's protocol, what it is read as, and the keys of a live answer."""
    from child_runtime.app import JSON_TYPE
    from child_runtime.protocol import unirl
    from child_runtime.protocol.headers import IDENTITY_HEADER

    status, kind, body, headers = answer
    lines = [f"#### The JSON form (`content-type: {JSON_TYPE}`)", "", doc(unirl), ""]
    lines.extend([f"Status {status}, `{kind.split(';')[0]}`, with these keys:", ""])
    lines.extend(
        table(["Key", "Kind of value"], [[code(key), _shape(value)] for key, value in body.items()])
    )
    example = json.dumps({k: v[:1] if isinstance(v, list) else v for k, v in body.items()})
    lines.extend(
        [f"For example `{example}`; `{IDENTITY_HEADER}` is on it as on a frame's answer.", ""]
    )
    if IDENTITY_HEADER not in headers:
        raise RuntimeError(f"/score's JSON answer lacks {IDENTITY_HEADER}")
    return lines


def _shape(value: Any) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, (list, tuple)):
        return "list"
    if value is None:
        return "null (here)"
    if hasattr(value, "typecode"):
        return "float64 array"
    return type(value).__name__


def _error_kinds() -> list[list[str]]:
    """(status, kind, raised by) of every error answer in child_runtime/app.py, read from its
    source."""
    from child_runtime import app, gate

    source = _AppSource(ast.parse(inspect.getsource(app)), vars(app))
    rows = [
        row
        for node in ast.walk(source.tree)
        if isinstance(node, ast.Call)
        for row in source.answers(node)
    ]
    evicted = json.loads(gate.EVICTION_BODY)
    rows.append(["503", code(evicted["kind"]), cell(f"the connection gate: {evicted['error']}")])
    rows.sort(key=lambda row: (row[0], row[1]))
    return rows


class _AppSource:
    """The child app's source: its `_error(...)` and `JSONResponse(...)` answers, and what raises
    them."""

    def __init__(self, tree: ast.AST, namespace: dict[str, Any]) -> None:
        self.tree, self.namespace = tree, namespace
        self.parents = {
            id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)
        }

    def values(self, node: ast.expr) -> list[Any]:
        if isinstance(node, ast.IfExp):
            return self.values(node.body) + self.values(node.orelse)
        # names and constants only
        return [eval(compile(ast.Expression(node), "app.py", "eval"), self.namespace)]

    def raised_by(self, handler: ast.ExceptHandler | None) -> str:
        if handler is None or handler.type is None:
            return ""
        names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        said = []
        for name in names:
            exc = eval(compile(ast.Expression(name), "app.py", "eval"), self.namespace)
            first = doc(exc).split("\n\n")[0] if exc.__module__ != "builtins" else ""
            said.append(f"`{exc.__name__}`" + (f": {cell(first)}" if first else ""))
        return "; ".join(said)

    def enclosing_handler(self, node: ast.AST) -> ast.ExceptHandler | None:
        while id(node) in self.parents:
            node = self.parents[id(node)]
            if isinstance(node, ast.ExceptHandler):
                return node
        return None

    def answers(self, node: ast.Call) -> list[list[str]]:
        """The rows of one call: an `_error(status, kind, ...)`, or the token check's
        JSONResponse."""
        if not isinstance(node.func, ast.Name):
            return []
        if node.func.id == "_error" and len(node.args) >= 2:
            by = self.raised_by(self.enclosing_handler(node)) or "the handler"
            return [
                [str(status), code(kind), by]
                for status in self.values(node.args[0])
                for kind in self.values(node.args[1])
            ]
        if node.func.id != "JSONResponse" or not node.args:
            return []
        body = node.args[0]
        # an expression
        status = next((k.value for k in node.keywords if k.arg == "status_code"), None)
        if not (isinstance(body, ast.Dict) and isinstance(status, ast.Constant)):
            return []
        return [
            [
                str(self.values(status)[0]),
                code(self.values(value)[0]),
                "`BearerAuth`: the token check",
            ]
            for key, value in zip(body.keys, body.values, strict=True)
            if isinstance(key, ast.Constant)
            and key.value == "kind"
            and isinstance(value, ast.Constant)
        ]


def http_page() -> str:
    from child_runtime import app as child_app
    from child_runtime.host import ScorerHost
    from child_runtime.protocol import exit_codes, headers, wire
    from scorers.registry import resolve_scorer
    from supervisor.ops import serve

    scorer = resolve_scorer("constant")()
    scorer.load("cpu")
    host = ScorerHost(scorer, "resident", identity_hash="0" * 64)
    host.onload()
    served = child_app.build_app(
        host, TOKEN, lambda: None, route_secrets=dict.fromkeys(child_app.HEADERLESS, SECRET)
    )
    starlette_app = served.app  # type: ignore[attr-defined]  # behind BearerAuth
    answers = _live_answers(served)

    lines = ["# HTTP surface", "", GENERATED, "", doc(child_app), ""]
    lines += [
        "A managed child and `managed-scorers serve` run the same app "
        "(`child_runtime.app.build_app`); `serve` adds the OpenRLHF route when given "
        "`--openrlhf-secret-file`, and UniRL's when given `--unirl-secret-file`. "
        "The routes below are read from that app, built over the "
        "`constant` scorer in the build's own process, and each answer shown was got from it "
        "by calling the route once.",
        "",
        "## Authentication",
        "",
        doc(child_app.BearerAuth),
        "",
        "## Routes",
        "",
    ]
    rows = []
    for route in starlette_app.routes:
        handler = _handler_of(route.endpoint, child_app._Endpoints)
        status, kind, body, _ = answers[route.path]
        shown_path = _shown_path(route.path)
        methods = sorted(route.methods - {"HEAD"})
        section = "-".join(["", *(m.lower() for m in methods), route.path.strip("/")])[1:]
        types = [kind] + ([answers["/score json"][1]] if route.path == "/score" else [])
        rows.append(
            [
                code(shown_path),
                ", ".join(methods),
                cell(doc(handler).split("\n\n")[0]) or f"see [its answer](#{section})",
                f"{status} " + " or ".join(code(t.split(";")[0]) for t in types),
            ]
        )
    lines.extend(table(["Path", "Method", "What it does", "Answer (status, type)"], rows))
    lines.extend(["## What each route answers", ""])
    for route in starlette_app.routes:
        status, kind, body, answer_headers = answers[route.path]
        lines.extend([f"### {' '.join(sorted(route.methods - {'HEAD'}))} {route.path}", ""])
        handler = _handler_of(route.endpoint, child_app._Endpoints)
        if doc(handler):
            lines.extend([doc(handler), ""])
        if isinstance(body, dict):
            rows = [[code(key), _shape(value)] for key, value in body.items()]
            lines.extend([f"Status {status}, `{kind.split(';')[0]}`, with these keys:", ""])
            lines.extend(table(["Key", "Kind of value"], rows))
        elif isinstance(body, list):
            lines.extend(
                [f"Status {status}, `{kind.split(';')[0]}`: a list, one entry per sample.", ""]
            )
        elif not body.startswith("# HELP"):
            lines.extend([f"Status {status}, `{kind.split(';')[0]}`: `{body.strip()}`.", ""])
        else:
            names = [line.split()[2] for line in body.splitlines() if line.startswith("# HELP")]
            helps = {
                line.split()[2]: " ".join(line.split()[3:])
                for line in body.splitlines()
                if line.startswith("# HELP")
            }
            lines.extend([f"Status {status}, `{kind.split(';')[0]}` (Prometheus text format):", ""])
            lines.extend(table(["Metric", "Help"], [[code(n), cell(helps[n])] for n in names]))
        if route.path == "/score":
            lines.extend(
                [
                    f"The request and the answer are `{wire.CONTENT_TYPE}` frames "
                    f"(`child_runtime.protocol.wire`):",
                    "",
                    doc(wire),
                    "",
                ]
            )
            timing = answer_headers.get("server-timing", "")
            phases = ", ".join(part.split(";")[0].strip() for part in timing.split(","))
            lines.extend(
                [f"Each answer carries a `server-timing` header with its phases: {phases}.", ""]
            )
            lines.extend(_json_score_section(answers["/score json"]))
    lines.extend(["## Headers", ""])
    header_rows = [
        [code(getattr(headers, name)), cell(comment)]
        for name, comment in _module_comments(headers).items()
        if name.endswith("_HEADER")
    ]
    lines.extend(table(["Header", "Meaning"], header_rows))
    lines.extend(["## Error answers", ""])
    status, _, refusal, _ = answers["401"]
    lines += [
        'Every error is a JSON object `{"error": <message>, "kind": <kind>}` with a status; '
        "a handler never "
        "lets an exception reach the server (which would drop the connection). For example, "
        "a request "
        f"without the token gets {status} and `{json.dumps(refusal)}`. The kinds, read from "
        "`child_runtime/app.py` and `child_runtime/gate.py`:",
        "",
    ]
    kinds = _error_kinds()
    lines.extend(table(["Status", "Kind", "Raised by"], kinds))
    lines.extend(["Kinds the parent acts on, as `child_runtime.protocol.wire` defines them:", ""])
    answered = {row[1] for row in kinds}
    wire_rows = [
        [code(getattr(wire, name)), cell(comment) or "(see the row above)"]
        for name, comment in _module_comments(wire).items()
        if isinstance(getattr(wire, name, None), str) and code(getattr(wire, name)) in answered
    ]
    lines.extend(table(["Kind", "Meaning"], wire_rows))
    lines.extend(["## Exit codes of a child that cannot boot", "", doc(exit_codes), ""])
    lines.extend(
        table(["Code", "Meaning"], [[str(c), cell(m)] for c, m in exit_codes.MEANINGS.items()])
    )
    lines.extend(["## `managed-scorers serve`", "", doc(serve), ""])
    return "\n".join(lines)


def _shown_path(path: str) -> str:
    """A headerless route's path as its client writes it: the secret after the route."""
    from child_runtime.protocol.openrlhf import ROUTE
    from child_runtime.protocol.unirl import ROUTE as UNIRL_ROUTE

    for route in (ROUTE, UNIRL_ROUTE):
        if path == route or path.startswith(route + "/"):
            return f"{route}/<secret>{path[len(route) :]}"
    return path


def _comments_by_line(source: str) -> dict[int, str]:
    """Each line's first comment, without its `#`: what a field or a constant says beside it."""
    trailing: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            trailing.setdefault(token.start[0], token.string.lstrip("#").strip())
    return trailing


def _module_comments(module: types.ModuleType) -> dict[str, str]:
    """Module-level NAME = ... assignments and their comments (above and trailing)."""
    source = inspect.getsource(module)
    lines = source.splitlines()
    trailing = _comments_by_line(source)
    found = {}
    for node in ast.parse(source).body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            above = []
            number = node.lineno - 1
            while number >= 1 and lines[number - 1].strip().startswith("#"):
                above.insert(0, lines[number - 1].strip().lstrip("#").strip())
                number -= 1
            own = [
                trailing[n]
                for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)
                if n in trailing
            ]
            found[node.targets[0].id] = " ".join([*above, *own])
    return found


# --- the scorer catalog ------------------------------------------------------------------------


def _params(cls: type) -> list[inspect.Parameter]:
    """The params a scorer takes: its constructor's, or a mapped function's after (candidate,
    context)."""
    per_candidate = getattr(cls, "per_candidate", None)
    if per_candidate is not None:
        return list(per_candidate.signature.parameters.values())[2:]
    signature = inspect.signature(cls.__init__)  # type: ignore[misc]
    return [
        p
        for p in list(signature.parameters.values())[1:]
        if p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    ]


def _param_text(parameter: inspect.Parameter) -> str:
    annotation = parameter.annotation
    kind = "" if annotation is inspect.Parameter.empty else f": {annotation}"
    if parameter.default is inspect.Parameter.empty:
        return f"`{parameter.name}{kind}` (required)"
    default = parameter.default
    shown = (
        json.dumps(default)
        if isinstance(default, (str, int, float, bool, type(None)))
        else repr(default)
    )
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return f"`{parameter.name}{kind} = {shown}`".replace("|", "\\|")


def scorers_page() -> str:
    from scorers import registry
    from supervisor import scorer_envs

    lines = ["# Scorer catalog", "", GENERATED, "", doc(registry), ""]
    lines += [
        "Every built-in scorer, read from `scorers.registry.BUILTINS` and each class's `spec`. "
        "**Env** is the scorer env its managed child runs in by default (`managed-scorers "
        "envs build ENV`); **groupwise** scorers get one whole group per call.",
        "",
    ]
    rows = []
    sections = []
    for name in registry.registered_names():
        cls = registry.resolve_scorer(name)
        spec = cls.spec
        params = _params(cls)
        summary = doc(cls).split("\n\n")[0]
        rows.append(
            [
                f"[`{name}`](#{name})",
                code(spec.input_kind),
                code(spec.env),
                "yes" if spec.groupwise else "",
                cell(summary),
            ]
        )
        section = [f"## {name}", "", f"`{registry.BUILTINS[name]}`", "", doc(cls), ""]
        facts = [
            f"- input kind: `{spec.input_kind}`; env: `{spec.env}`; revision: `{spec.revision}`",
            f"- terms: {', '.join(f'`{t}`' for t in spec.term_names())}"
            + (f"; reward term: `{spec.reward_term}`" if spec.reward_term else ""),
        ]
        if spec.required_fields:
            facts.append(
                f"- needs the item fields: {', '.join(f'`{f}`' for f in spec.required_fields)}"
            )
        if spec.diagnostics:
            facts.append(f"- diagnostics: {', '.join(f'`{d}`' for d in spec.diagnostics)}")
        if spec.requires_modules:
            facts.append(
                f"- imports from its env: {', '.join(f'`{m}`' for m in spec.requires_modules)}"
            )
        flags = [
            label
            for label, on in (
                ("groupwise", spec.groupwise),
                ("groups of any size", spec.ragged_groups),
                ("can offload (`gpu_residency: per_call`)", spec.supports_offload),
            )
            if on
        ]
        if flags:
            facts.append(f"- {'; '.join(flags)}")
        facts.append(
            "- params: " + (", ".join(_param_text(p) for p in params) if params else "none")
        )
        section.extend([*facts, ""])
        sections.extend(section)
    lines.extend(table(["Name", "Input", "Env", "Groupwise", "What it scores"], rows))
    pins = {
        env: [
            line.strip()
            for line in scorer_envs.spec_path(env).read_text().splitlines()
            if line.strip() and not line.startswith("#")
        ]
        for env in scorer_envs.spec_names()
    }
    common = set.intersection(*(set(found) for found in pins.values()))
    env_rows = [
        [code(env), ", ".join(f"`{pin}`" for pin in found if pin not in common)]
        for env, found in pins.items()
    ]
    lines.extend(
        [
            "## Scorer envs",
            "",
            "What each env installs (`supervisor/env_specs/`), beyond the pins they share:",
            "",
        ]
    )
    lines.extend(table(["Env", "Its own pins"], env_rows))
    lines.extend(["Every env pins: " + ", ".join(f"`{pin}`" for pin in sorted(common)) + ".", ""])
    lines.extend(sections)
    return "\n".join(lines)


# --- entry points ------------------------------------------------------------------------------

PAGES: dict[str, Callable[[], str]] = {
    "reference/cli.md": cli_page,
    "reference/config.md": config_page,
    "reference/http.md": http_page,
    "reference/scorers.md": scorers_page,
}


def write_with(opener: Callable[[str, str], Any]) -> None:
    for path, make in PAGES.items():
        text = make().rstrip() + "\n"
        with opener(path, "w") as out:
            out.write(text)


if __name__ == "<run_path>":  # mkdocs-gen-files runs this file with runpy
    import mkdocs_gen_files

    write_with(mkdocs_gen_files.open)
elif __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "reference-preview")

    def _open(path: str, mode: str) -> Any:
        (target / path).parent.mkdir(parents=True, exist_ok=True)
        return open(target / path, mode)

    write_with(_open)
    print(f"wrote {', '.join(PAGES)} under {target}")
