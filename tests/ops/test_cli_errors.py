"""The CLI never traces back: each configuration or input error is one line on stderr naming the
file and line or the flag, exit 2, found in this process before any child starts (the real CLI, run
as a subprocess). Also `--version`, `--log-level`, `serve`'s stderr and the shipped recipes'
descriptions."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from supervisor.compose.recipes import load_recipe
from supervisor.errors import ConfigError
from supervisor.ops import cli
from supervisor.ops.precheck import check_recipe
from supervisor.ops.preflight import preflight
from supervisor.ops.shipped_recipes import EXAMPLES, description, example_recipes
from tests.conftest import REPO_ROOT

CLI = [sys.executable, "-m", "supervisor"]
TOKEN = "a-token-of-at-least-16-chars"


def run(*args: str | Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "MANAGED_SCORERS_TOKEN": TOKEN, **env}
    return subprocess.run(
        [*CLI, *map(str, args)], capture_output=True, text=True, timeout=120, env=environ
    )


def refused(done: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Exit 2, one line on stderr saying every fragment, no traceback, nothing on stdout."""
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert all(fragment in done.stderr for fragment in fragments), (fragments, done.stderr)
    return done.stderr


def local_recipe(path: Path, scorer: str = "exact_match", **model: object) -> Path:
    """A verl-omni recipe of one in-process term: nothing to boot."""
    models = {"m": {"backend": "local", "scorer": scorer, **model}}
    path.write_text(json.dumps({"reward": {"models": models, "reward_functions": {"m": {}}}}))
    return path


def rows(path: Path, *records: dict) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def test_a_missing_or_folder_input_is_one_line_naming_it(tmp_path):
    recipe = local_recipe(tmp_path / "r.json")
    for given in (tmp_path / "missing.jsonl", tmp_path):
        done = run("score", "--recipe", recipe, "--input", given, "--output", tmp_path / "o.jsonl")
        refused(done, str(given))
    assert not (tmp_path / "o.jsonl").exists()


def test_a_missing_reference_column_is_named_by_line_before_any_child_starts(tmp_path):
    # the first row has a reference, the second not: exact_match requires one
    # (ScorerSpec.required_fields)
    data = rows(
        tmp_path / "in.jsonl", {"response": "a", "reference": "a"}, {"response": "b", "answer": "b"}
    )
    recipe = local_recipe(tmp_path / "r.json")
    done = run("score", "--recipe", recipe, "--input", data, "--output", tmp_path / "o.jsonl")
    refused(
        done, f"{data}:2: no reference in column 'reference' (--reference-column)", "'exact_match'"
    )
    # a term that does not apply to the row's dataset requires nothing of it
    models = {
        "m": {"backend": "local", "scorer": "exact_match"},
        "n": {"backend": "local", "scorer": "nonempty"},
    }
    functions = {"m": {"applicable_datasets": ["math"]}, "n": {}}
    recipe.write_text(json.dumps({"reward": {"models": models, "reward_functions": functions}}))
    rows(
        data,
        {"response": "a", "reference": "a", "data_source": "math"},
        {"response": "b", "data_source": "chat"},
    )
    done = run("score", "--recipe", recipe, "--input", data, "--output", tmp_path / "o.jsonl")
    assert done.returncode == 0, done.stderr


def test_an_image_scorer_without_an_image_column_names_the_flag(tmp_path):
    # no text: the term reads none, the flag is what lacks
    data = rows(tmp_path / "in.jsonl", {"image": "a.png"})
    recipe = local_recipe(tmp_path / "r.json", "jpeg_compressibility")
    done = run("score", "--recipe", recipe, "--input", data, "--output", tmp_path / "o.jsonl")
    refused(done, "'jpeg_compressibility'", "--image-column")


def test_a_misspelt_scorer_suggests_the_nearest_in_a_recipe_and_in_serve(tmp_path):
    data = rows(tmp_path / "in.jsonl", {"response": "a", "reference": "a"})
    recipe = local_recipe(tmp_path / "r.yaml", "math_verfy")
    done = run("score", "--recipe", recipe, "--input", data, "--output", tmp_path / "o.jsonl")
    refused(
        done, str(recipe), "reward.m", "unknown scorer 'math_verfy' (did you mean 'math_verify'?)"
    )
    for kind in ([], ["--input-kind", "text"]):
        refused(run("serve", "--scorer", "math_verfy", *kind), "did you mean 'math_verify'?")
    # before any bind
    refused(run("serve", "--recipe", recipe), str(recipe), "did you mean 'math_verify'?")


def test_serve_refuses_an_unknown_param_here_listing_the_valid_ones():
    done = run("serve", "--scorer", "math_verify", "--params", '{"jbos": 2}')
    refused(
        done,
        "--scorer math_verify",
        "unknown param 'jbos' (did you mean 'jobs'?)",
        "its params: jobs, timeout_s",
    )


def test_a_recipe_with_an_unknown_param_is_refused_before_its_child_boots(tmp_path):
    data = rows(tmp_path / "in.jsonl", {"response": "a", "reference": "a"})
    recipe = tmp_path / "r.json"
    models = {"m": {"scorer": "math_verify", "env": "math", "params": {"jbos": 2}}}
    recipe.write_text(json.dumps({"reward": {"models": models, "reward_functions": {"m": {}}}}))
    done = run("score", "--recipe", recipe, "--input", data, "--output", tmp_path / "o.jsonl")
    refused(done, str(recipe), "reward.m", "unknown param 'jbos' (did you mean 'jobs'?)")


def test_a_model_of_an_image_scorer_takes_its_scorers_input_kind():
    recipe = load_recipe(
        {
            "reward": {
                "models": {"jpeg": {"scorer": "jpeg_compressibility", "env": "image"}},
                "reward_functions": {"jpeg": {}},
            }
        }
    )
    backend = recipe.train.terms[0].backend
    assert backend.scorer.input_kind == "image" and backend.client.input_kind == "image"  # type: ignore[union-attr]
    explicit = load_recipe(
        {
            "reward": {
                "models": {"j": {"scorer": "exact_match", "backend": "local"}},
                "reward_functions": {"j": {}},
            }
        }
    )
    assert explicit.train.terms[0].backend.client.input_kind == "text"  # type: ignore[union-attr]


def test_version_is_the_distributions_and_unknown_flags_exit_2():
    done = run("--version")
    assert (
        done.returncode == 0
        and done.stdout.strip()
        == f"managed-scorers {importlib.metadata.version('managed-scorers')}"
    )
    bad = run("--log-level", "loud", "recipes")
    assert bad.returncode == 2 and "--log-level" in bad.stderr and "Traceback" not in bad.stderr


@pytest.fixture
def loggers_restored() -> Iterator[None]:
    """cli.main sets our packages' logger levels: this pytest process gets them back as they
    were."""
    saved = {
        name: logging.getLogger(name).level
        for name in ("supervisor", "scorers", "child_runtime", "httpx")
    }
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


def test_log_level_sets_our_loggers_and_leaves_the_others_at_warning(loggers_restored):
    cli._logging("debug")
    assert logging.getLogger("supervisor.backends.managed").getEffectiveLevel() == logging.DEBUG
    assert logging.getLogger("scorers.grading.pool").getEffectiveLevel() == logging.DEBUG
    assert logging.getLogger("httpx").getEffectiveLevel() >= logging.WARNING


def test_every_exit_status_is_documented_in_the_help_and_on_the_operating_page():
    page = (REPO_ROOT / "docs" / "operating.md").read_text()
    helped = cli.parser().format_help()
    for code, _ in cli.EXIT_STATUS:
        assert re.search(rf"^\|\s*`?{code}`?\s*\|", page, re.MULTILINE), (
            f"exit {code} is not in docs/operating.md"
        )
        assert re.search(rf"^\s+{code}\s", helped, re.MULTILINE), f"exit {code} is not in --help"


def test_the_shipped_recipes_list_whole_sentences_naming_modules_that_import(
    capsys, loggers_restored
):
    assert cli.main(["recipes"]) == 0
    listed = capsys.readouterr().out
    for name, path in example_recipes().items():
        line = next(line for line in listed.splitlines() if line.startswith(name))
        assert line.endswith(".") and description(path) in line, line
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for dotted in re.findall(
            r"\b((?:supervisor|scorers|child_runtime)(?:\.\w+)+)", path.read_text()
        ):
            assert _imports(dotted), f"{path.name} names {dotted}, which does not import"


def _imports(dotted: str) -> bool:
    """`a.b.c` is a module, or an attribute chain of the longest prefix that is one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def test_serve_says_where_it_listens_and_one_line_per_request_on_stderr_its_ready_line_on_stdout(
    tmp_path,
):
    secret_file = tmp_path / "secret"
    command = [
        *CLI,
        "serve",
        "--scorer",
        "exact_match",
        "--env",
        "image",
        "--openrlhf-secret-file",
        str(secret_file),
    ]
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        server = subprocess.Popen(
            command, stdout=out, stderr=err, env={**os.environ, "MANAGED_SCORERS_TOKEN": TOKEN}
        )
    try:
        ready = _ready(tmp_path / "out", server)
        url = f"http://127.0.0.1:{ready['port']}"
        assert (
            httpx.get(f"{url}/health", headers={"Authorization": f"Bearer {TOKEN}"}).status_code
            == 200
        )
        assert httpx.get(f"{url}/health").status_code == 401
        secret = secret_file.read_text().strip()
        assert httpx.post(f"{url}/openrlhf/{secret}", json={}).status_code == 400
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
    said = (tmp_path / "err").read_text()
    assert f"managed-scorers serve: listening on {url}\n" in said, said
    assert re.search(r'127\.0\.0\.1:\d+ "GET /health" 200 [\d.]+ ms', said), said
    assert re.search(r'"GET /health" 401', said) and '"POST /openrlhf/<secret>" 400' in said, said
    assert secret not in said and TOKEN not in said
    # stdout: the ready line only
    assert json.loads((tmp_path / "out").read_text().splitlines()[0])["ready"] is True


def _ready(path: Path, server: subprocess.Popen[bytes], deadline_s: float = 60) -> dict:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        text = path.read_text()
        if text.endswith("\n"):
            return json.loads(text.splitlines()[0])
        assert server.poll() is None, f"serve exited {server.returncode}"
        time.sleep(0.05)
    raise AssertionError(f"no readiness line after {deadline_s} s")


def test_preflight_names_unknown_params_with_the_valid_ones():
    models = {"m": {"backend": "local", "scorer": "constant", "params": {"valeu": 2}}}
    report = preflight(
        {"reward": {"models": models, "reward_functions": {"m": {}}}}, raise_on_problems=False
    )
    assert report.problems == [
        "reward.m: scorer 'constant' params: unknown param 'valeu' (did you mean 'value'?); "
        "its params: value"
    ]


def test_a_recipe_error_names_the_line_it_is_on_in_each_style(tmp_path):
    """The YAML's own marks give the line: of a field the models refuse, of a parser's dotted path,
    of a term preflight refuses (found by its name), of a YAML syntax error. One line each."""

    def refusal(name: str, text: str) -> str:
        (tmp_path / name).write_text(text)
        with pytest.raises(ConfigError) as raised:
            check_recipe(load_recipe(tmp_path / name), tmp_path / name)
        assert "\n" not in str(raised.value)
        return str(raised.value).removeprefix(f"{tmp_path / name}:")

    native = (
        "terms:\n  - name: ok\n    backend: {kind: local, scorer: {name: nonempty}}\n  - "
        "name: w\n    weight: abc\n"
    )
    assert refusal(
        "weight.yaml", native + "    backend: {kind: local, scorer: {name: nonempty}}\n"
    ).startswith("5: terms.1.weight")
    verl_omni = (
        "reward:\n  models:\n    j: {backend: local, scorer: nonempty}\n  "
        "reward_functions:\n    c: {model: k}\n"
    )
    assert refusal("omni.yaml", verl_omni).startswith(
        "5: reward.reward_functions.c: model 'k' is not in"
    )
    assert refusal("syntax.yaml", "terms:\n  - name: a\n   backend: [\n").startswith(
        "3: not YAML: expected"
    )
    two = native.replace(
        "weight: abc", "backend: {kind: local, scorer: {name: nonempty, params: {jbos: 2}}}"
    )
    said = refusal("terms.yaml", two.replace("name: nonempty}", "name: nonemty}", 1))
    assert said.startswith("2: reward.ok: unknown scorer 'nonemty' (did you mean 'nonempty'?)"), (
        said
    )
    assert said.endswith("NonEmpty takes no params, got ['jbos'] (line 4)"), said


def test_a_backend_that_names_a_scorer_env_is_a_managed_child():
    recipe = load_recipe(
        {"terms": [{"name": "c", "backend": {"env": "math", "scorer": {"name": "math_verify"}}}]}
    )
    assert recipe.train.terms[0].backend.kind == "managed"


def test_a_misspelt_verl_omni_key_and_groups_without_a_group_column_are_refused(
    tmp_path, capsys, loggers_restored
):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "reward:\n  group_sise: 4\n  reward_manager: {name: MultiVisualRewardManager}\n"
        "  models:\n    j: {backend: local, scorer: nonempty}\n  reward_functions:\n    j: {}\n"
    )
    with pytest.raises(
        ConfigError,
        match=r"r.yaml:2: reward.group_sise: not a key .* \(did you mean 'group_size'\?\)",
    ):
        load_recipe(recipe)
    recipe.write_text(recipe.read_text().replace("group_sise", "group_size"))
    # verl-omni's own keys (reward_manager) are its, not ours
    assert load_recipe(recipe).train.group_size == 4
    data = rows(tmp_path / "in.jsonl", {"response": "a"})
    assert (
        cli.main(
            [
                "score",
                "--recipe",
                str(recipe),
                "--input",
                str(data),
                "--output",
                str(tmp_path / "o.jsonl"),
            ]
        )
        == 2
    )
    assert "declares groups of 4: name each row's group (--group-column)" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()
