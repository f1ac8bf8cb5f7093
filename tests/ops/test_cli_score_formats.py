"""`managed-scorers score` on datasets as the frameworks store them, into outputs users' tools read:
a TRL conversational JSONL, a verl Parquet with its gold nested in `reward_model`, a `save_to_disk`
folder, stdin to stdout; each output read back with pandas and `datasets` (envs/trl has both, and
pyarrow, which the dev env does not: the Parquet and `datasets` runs use that python)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, env_python

ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}  # the recipes name fixture scorers from tests/


def run(
    python: str | Path, *args: str | Path, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    command = [str(python), "-m", "supervisor", "score", *map(str, args)]
    return subprocess.run(
        command, env=ENV, input=stdin, capture_output=True, text=True, timeout=300
    )


def math_recipe(path: Path) -> Path:
    models = {
        "math": {
            "backend": "managed",
            "scorer": "math_verify",
            "env": "math",
            "params": {"jobs": 2},
        }
    }
    path.write_text(
        json.dumps(
            {"reward": {"models": models, "reward_functions": {"correct": {"model": "math"}}}}
        )
    )
    return path


def probe_recipe(path: Path) -> Path:
    models = {"m": {"backend": "local", "scorer": "tests.helpers.fixture_scorers:Probe"}}
    path.write_text(
        json.dumps({"reward": {"models": models, "reward_functions": {"len": {"model": "m"}}}})
    )
    return path


READ_BACK = """
import json, sys
import datasets, pandas

datasets.disable_progress_bars()
seen = {}
for path in sys.argv[1:]:
    kind = "parquet" if path.endswith(".parquet") else "json"
    frame = (
        pandas.read_parquet(path)
        if kind == "parquet"
        else pandas.read_json(path, lines=True, dtype=False)
    )
    loaded = datasets.load_dataset(kind, data_files=path, split="train")
    seen[path] = {
        "pandas": {
            "rows": len(frame),
            "columns": list(frame.columns),
            "reward": frame["reward"].tolist(),
            "id": frame["id"].astype(str).tolist(),
        },
        "datasets": {
            "rows": loaded.num_rows,
            "reward": list(loaded["reward"]),
            "components": list(loaded["components"]),
        },
    }
print(json.dumps(seen))
"""


def read_back(tmp_path: Path, *outputs: Path) -> dict[str, dict]:
    """What pandas and `datasets` see in each output (in envs/trl, offline, its cache in
    tmp_path)."""
    env = {**ENV, "HF_DATASETS_CACHE": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [str(env_python("trl")), "-c", READ_BACK, *map(str, outputs)], env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return {
        Path(path).name: seen for path, seen in json.loads(done.stdout.splitlines()[-1]).items()
    }


def sidecar(path: Path) -> dict:
    return json.loads(path.with_name(path.name + ".meta.json").read_text())


# TRL's conversational format: the prompt and the completion as chat messages, the gold in
# `solution`
TRL_ROWS = [
    {
        "prompt": [
            {"role": "system", "content": "Answer in a box."},
            {"role": "user", "content": f"What is {i}?"},
        ],
        "completion": [{"role": "assistant", "content": f"So it is \\boxed{{{i}}}."}],
        "solution": str(i + (i % 2)),
    }
    for i in range(4)
]


@pytest.mark.slow
def test_a_trl_conversational_jsonl_and_stdin_to_stdout_read_back_one_record_per_row(tmp_path):
    (tmp_path / "trl.jsonl").write_text("".join(json.dumps(row) + "\n" for row in TRL_ROWS))
    recipe, out = math_recipe(tmp_path / "r.json"), tmp_path / "out.jsonl"
    with ThreadPoolExecutor(2) as pool:  # two runs, each its own child: side by side
        to_file = pool.submit(
            run, sys.executable, "--recipe", recipe, "--input", tmp_path / "trl.jsonl",
            "--output", out, "--preset", "trl",
        )  # fmt: skip
        to_stdout = pool.submit(
            run, sys.executable, "--recipe", recipe, "--input", "-", "--output", "-", "--preset",
            "trl", stdin=(tmp_path / "trl.jsonl").read_text(),
        )  # fmt: skip
        done, piped = to_file.result(), to_stdout.result()
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # the last assistant message against `solution`
    assert [r["reward"] for r in rows] == [1.0, 0.0, 1.0, 0.0]
    meta = sidecar(out)
    assert (
        meta["columns"]["response"] == "completion" and meta["columns"]["reference"] == "solution"
    )
    assert meta["terms"]["correct"]["scorer"] == "math_verify" and len(meta["identity_hash"]) == 64
    assert piped.returncode == 0, piped.stderr
    # the rows and nothing else; the identity is said on stderr
    assert piped.stdout == out.read_text()
    assert meta["identity_hash"] in piped.stderr
    assert not (tmp_path / "-").exists() and not list(Path.cwd().glob("-*"))
    (tmp_path / "piped.jsonl").write_text(piped.stdout)
    seen = read_back(tmp_path, out, tmp_path / "piped.jsonl")
    for name in ("out.jsonl", "piped.jsonl"):
        assert seen[name]["pandas"]["rows"] == 4 and seen[name]["datasets"]["rows"] == 4
        assert (
            seen[name]["pandas"]["reward"]
            == seen[name]["datasets"]["reward"]
            == [1.0, 0.0, 1.0, 0.0]
        )
        assert seen[name]["pandas"]["columns"] == [
            "id",
            "reward",
            "components",
            "failed_terms",
            "error",
            "input_sha",
        ]
    refused = run(
        sys.executable,
        "--recipe",
        recipe,
        "--input",
        tmp_path / "trl.jsonl",
        "--output",
        "-",
        "--resume",
    )
    assert (
        refused.returncode == 2 and refused.stderr.count("\n") == 1 and "stdout" in refused.stderr
    ), refused.stderr
    out.with_name("out.jsonl.meta.json").unlink()
    orphan = run(
        sys.executable,
        "--recipe",
        recipe,
        "--input",
        tmp_path / "trl.jsonl",
        "--output",
        out,
        "--resume",
        "--preset",
        "trl",
    )
    assert orphan.returncode == 2 and "no out.jsonl.meta.json beside it" in orphan.stderr, (
        orphan.stderr
    )


# verl's generation output as pandas writes it (main_generation: `dataset.to_parquet`): prompts as
# chat messages, `responses` (one per prompt here), the gold in `reward_model`; and a TRL dataset
# saved with `save_to_disk`. argv: the verl rows (JSON), the TRL rows (JSON), then the three paths
# to write.
MAKE_FILES = """
import json, sys
import datasets, pandas
verl, trl = json.loads(sys.argv[1]), json.loads(sys.argv[2])
pandas.DataFrame(verl).to_parquet(sys.argv[3])
verl[1]["responses"] = ["\\\\boxed{4}", "\\\\boxed{5}"]  # two samples of one prompt
pandas.DataFrame(verl).to_parquet(sys.argv[4])
datasets.Dataset.from_list(trl).save_to_disk(sys.argv[5])
"""

VERL_ROWS = [
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": gold},
        "extra_info": {"split": "test", "index": index},
        "responses": [response],
    }
    for index, (question, gold, response) in enumerate(
        [("What is 6 * 7?", "42", "6 * 7 = \\boxed{42}"), ("What is 2 + 2?", "4", "\\boxed{5}")]
    )
]


@pytest.mark.slow
def test_a_verl_parquet_and_a_save_to_disk_folder_scored_into_parquet_and_jsonl_read_back(tmp_path):
    parquet, saved, two = tmp_path / "verl.parquet", tmp_path / "saved", tmp_path / "two.parquet"
    trl = env_python("trl")
    env = {**ENV, "HF_DATASETS_CACHE": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    made = subprocess.run(
        [str(trl), "-c", MAKE_FILES, json.dumps(VERL_ROWS), json.dumps(TRL_ROWS), parquet, two,
         saved],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr[-3000:]
    recipe = math_recipe(tmp_path / "r.json")
    with ThreadPoolExecutor(2) as pool:  # two runs, each its own child: side by side
        from_parquet = pool.submit(
            run, trl, "--recipe", recipe, "--input", parquet, "--output",
            tmp_path / "verl.out.parquet", "--preset", "verl",
        )  # fmt: skip
        from_folder = pool.submit(
            run, trl, "--recipe", recipe, "--input", saved, "--output", tmp_path / "saved.jsonl",
            "--preset", "trl",
        )  # fmt: skip
        done, from_disk = from_parquet.result(), from_folder.result()
    assert done.returncode == 0, done.stderr
    assert (
        sidecar(tmp_path / "verl.out.parquet")["columns"]["reference"]
        == "reward_model.ground_truth"
    )
    assert from_disk.returncode == 0, from_disk.stderr
    seen = read_back(tmp_path, tmp_path / "verl.out.parquet", tmp_path / "saved.jsonl")
    verl = seen["verl.out.parquet"]
    assert verl["pandas"]["rows"] == verl["datasets"]["rows"] == 2
    assert verl["pandas"]["reward"] == verl["datasets"]["reward"] == [1.0, 0.0]
    assert verl["datasets"]["components"] == [{"correct": 1.0}, {"correct": 0.0}]
    assert verl["pandas"]["id"] == ["row-1", "row-2"]
    assert (
        seen["saved.jsonl"]["pandas"]["reward"]
        == seen["saved.jsonl"]["datasets"]["reward"]
        == [1.0, 0.0, 1.0, 0.0]
    )
    refusals = {
        "two.parquet row 2: column 'responses' holds 2 responses": [two, "--preset", "verl"],
        "give one split's folder": [_dataset_dict(saved), "--preset", "trl"],
        "is Parquet, written whole when the run ends": [parquet, "--preset", "verl", "--resume"],
    }
    for message, args in refusals.items():
        refused = run(
            trl,
            "--recipe",
            recipe,
            "--input",
            *args[:1],
            "--output",
            tmp_path / "x.parquet",
            *args[1:],
        )
        assert (
            refused.returncode == 2
            and refused.stderr.count("\n") == 1
            and message in refused.stderr
        ), refused.stderr
        assert not (tmp_path / "x.parquet").exists()


# a `datasets` Image column, saved with `save_to_disk`: each cell is stored as `{bytes, path}`
IMAGES = """
import sys, datasets, numpy
from PIL import Image

rows = [
    {"id": f"i{v}", "image": Image.fromarray(numpy.full((8, 8, 3), v, numpy.uint8))}
    for v in (0, 51, 255)
]
features = datasets.Features({"id": datasets.Value("string"), "image": datasets.Image()})
datasets.Dataset.from_list(rows, features=features).save_to_disk(sys.argv[1])
"""


@pytest.mark.slow
def test_a_datasets_image_column_is_scored_and_a_cell_that_is_no_image_is_quoted_short(tmp_path):
    folder, trl = tmp_path / "images", env_python("trl")
    env = {**ENV, "HF_DATASETS_CACHE": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    made = subprocess.run(
        [str(trl), "-c", IMAGES, folder], env=env, capture_output=True, text=True, timeout=300
    )
    assert made.returncode == 0, made.stderr[-3000:]
    recipe = tmp_path / "r.json"
    models = {"m": {"backend": "local", "scorer": "mean_intensity"}}
    recipe.write_text(
        json.dumps({"reward": {"models": models, "reward_functions": {"bright": {"model": "m"}}}})
    )
    done = run(
        trl,
        "--recipe",
        recipe,
        "--input",
        folder,
        "--output",
        tmp_path / "o.jsonl",
        "--image-column",
        "image",
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [(row["id"], row["reward"]) for row in rows] == [
        ("i0", 0.0),
        ("i51", 0.2),
        ("i255", 1.0),
    ]
    big = tmp_path / "big.jsonl"  # a cell of 1 MB that names no file: the error quotes it cut short
    big.write_text(json.dumps({"id": "a", "image": "x" * 1_000_000}) + "\n")
    refused = run(
        sys.executable,
        "--recipe",
        recipe,
        "--input",
        big,
        "--output",
        tmp_path / "b.jsonl",
        "--image-column",
        "image",
    )
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr[:500]
    assert (
        "must name an image file or hold a datasets Image, got 'xxx" in refused.stderr
        and len(refused.stderr) < 400
    )


def _dataset_dict(split: Path) -> Path:
    """A folder as DatasetDict.save_to_disk leaves it: dataset_dict.json and one folder per
    split."""
    folder = split.parent / "dict"
    (folder / "train").mkdir(parents=True)
    (folder / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    return folder


NOISY = """
from tests.helpers.fixture_scorers import Probe


class Noisy(Probe):
    def score(self, items):
        print("a scorer's print")
        return super().score(items)
"""


def test_stdout_holds_the_rows_alone_even_when_a_scorer_prints(tmp_path):
    (tmp_path / "noisy.py").write_text(NOISY)
    models = {"m": {"backend": "local", "scorer": "noisy:Noisy"}}
    recipe = tmp_path / "r.json"
    recipe.write_text(
        json.dumps({"reward": {"models": models, "reward_functions": {"len": {"model": "m"}}}})
    )
    done = subprocess.run(
        [sys.executable, "-m", "supervisor", "score", "--recipe", str(recipe), "--input", "-",
         "--output", "-"],
        env={**ENV, "PYTHONPATH": f"{REPO_ROOT}:{tmp_path}"},
        input='{"response": "abc"}\n{"response": "de"}\n',
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["reward"] for line in done.stdout.splitlines()] == [3.0, 2.0]
    assert "a scorer's print" in done.stderr


def test_nested_columns_chat_messages_and_json_lists_are_read_and_their_refusals_named_by_row(
    tmp_path,
):
    """A dotted path, a preset with a column flag over it, a JSON list of records; a completion with
    no assistant message refused by line; a Parquet or save_to_disk input without its extra: one
    line."""
    rows = [
        {"id": "a", "q": {"text": [{"role": "user", "content": "hi"}]},
         "r": [{"role": "assistant", "content": "xyz"}]},
        {"id": "b", "q": {"text": "hello"},
         "r": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "pq"}]},
    ]  # fmt: skip
    (tmp_path / "in.json").write_text(json.dumps(rows, indent=1))
    recipe, out = probe_recipe(tmp_path / "r.json"), tmp_path / "out.jsonl"
    args = [
        "--recipe",
        recipe,
        "--prompt-column",
        "q.text",
        "--preset",
        "trl",
        "--response-column",
        "r",
    ]
    done = run(sys.executable, *args, "--input", tmp_path / "in.json", "--output", out)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["reward"] for line in out.read_text().splitlines()] == [3.0, 2.0]
    assert (
        sidecar(out)["columns"]["prompt"] == "q.text"
        and sidecar(out)["columns"]["reference"] == "solution"
    )
    no_answer = [rows[0], {"id": "c", "r": [{"role": "user", "content": "only a question"}]}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in no_answer))
    refused = run(
        sys.executable, *args, "--input", tmp_path / "in.jsonl", "--output", tmp_path / "o"
    )
    assert (
        refused.returncode == 2
        and "in.jsonl:2: column 'r' holds chat messages with no assistant" in refused.stderr
    )
    assert not (tmp_path / "o").exists()
    (tmp_path / "data.parquet").write_bytes(b"PAR1")
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "state.json").write_text("{}")
    for given, extra in ((tmp_path / "data.parquet", "parquet"), (tmp_path / "saved", "datasets")):
        if extra == "parquet" and _has("pyarrow") or extra == "datasets" and _has("datasets"):
            continue  # this python has it: the message cannot show here
        missing = run(
            sys.executable, "--recipe", recipe, "--input", given, "--output", tmp_path / "o"
        )
        assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
        assert f"pip install 'managed-scorers[{extra}]'" in missing.stderr
    for given, message in (
        (tmp_path / "none.jsonl", "no such file"),
        (tmp_path, "not a dataset saved with"),
    ):
        missing = run(
            sys.executable, "--recipe", recipe, "--input", given, "--output", tmp_path / "o"
        )
        assert (
            missing.returncode == 2
            and message in missing.stderr
            and "Traceback" not in missing.stderr
        )


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
