"""`managed-scorers score`: a JSONL dataset through a recipe, one output row per input row,
resumable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO_ROOT
from tests.helpers.fixture_scorers import journal_calls

CLI = [sys.executable, "-m", "supervisor", "score"]
ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}  # the recipes name fixture scorers from tests/


def write_rows(path: Path, n: int) -> list[dict]:
    rows = [
        {
            "id": f"r{i}",
            "prompt": f"what is {i}?",
            "response": f"so \\boxed{{{i}}}",
            "reference": str(i + (i % 3 == 0)),
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


def recipe(
    path: Path, journal: Path | None = None, probe: str = "Probe", sleep_s: float = 0.0
) -> Path:
    """The managed math term, plus (with a journal) an in-process probe that records every call's
    ids."""
    models: dict = {
        "math": {
            "backend": "managed",
            "scorer": "math_verify",
            "env": "math",
            "params": {"jobs": 2},
        }
    }
    functions: dict = {"correct": {"model": "math"}}
    if journal is not None:
        params = {"journal": str(journal), "sleep_s": sleep_s}
        models["probe"] = {
            "backend": "local",
            "scorer": f"tests.helpers.fixture_scorers:{probe}",
            "params": params,
        }
        functions["length"] = {"model": "probe", "weight": 0.0}
    path.write_text(json.dumps({"reward": {"models": models, "reward_functions": functions}}))
    return path


def output_rows(path: Path) -> tuple[dict, list[dict]]:
    """The run's metadata (its sidecar) and the output's records."""
    header = json.loads(path.with_name(path.name + ".meta.json").read_text())
    return header, [json.loads(line) for line in path.read_text().splitlines()]


def score(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *map(str, args)], env=ENV, capture_output=True, text=True, timeout=timeout
    )


# the CLI as a terminal runs it: with Python's Ctrl-C handler even when this test's launcher ignored
# SIGINT (a background job of a non-interactive shell does, and children inherit it)
INTERRUPTIBLE = [
    sys.executable,
    "-c",
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from supervisor.ops.cli import main; sys.exit(main())",
    "score",
]


def start(*args: str | Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*INTERRUPTIBLE, *map(str, args)],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_rows(
    path: Path, at_least: int, proc: subprocess.Popen[str], deadline_s: float = 120
) -> int:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if path.exists():
            written = path.read_text().count("\n")
            if written >= at_least:
                return written
        time.sleep(0.02)
    raise AssertionError(f"fewer than {at_least} rows in {path} after {deadline_s} s")


@pytest.mark.slow
def test_a_thousand_rows_scored_in_input_order_with_a_sidecar(tmp_path):
    rows = write_rows(tmp_path / "in.jsonl", 1000)
    done = score(
        "--recipe",
        recipe(tmp_path / "r.json"),
        "--input",
        tmp_path / "in.jsonl",
        "--output",
        tmp_path / "out.jsonl",
    )
    assert done.returncode == 0, done.stderr
    header, out = output_rows(tmp_path / "out.jsonl")
    assert (
        header["terms"]["correct"]["scorer"] == "math_verify" and len(header["identity_hash"]) == 64
    )
    assert [r["id"] for r in out] == [r["id"] for r in rows]
    assert [r["reward"] for r in out] == [0.0 if i % 3 == 0 else 1.0 for i in range(1000)]
    assert all(r["error"] is None and r["components"] == {"correct": r["reward"]} for r in out)
    assert "1000 rows scored (0 with errors, 0 missing a failed optional term)" in done.stderr
    # the training panel: train/, not val/
    assert "train/reward/correct/sample_count=1000" in done.stderr
    # math_verify times nothing itself: the CLI times each chunk (16 requests of one chunk each)
    assert "train/reward/correct/runtime.chunk_s/count=16" in done.stderr
    assert "tail: correct runtime.chunk_s: p50 <= " in done.stderr
    assert "tail: correct runtime.slowest_chunks: r" in done.stderr


@pytest.mark.slow
def test_killed_halfway_then_resumed_scores_every_row_once_but_the_batch_in_flight(tmp_path):
    rows = write_rows(tmp_path / "in.jsonl", 1000)
    journal, out = tmp_path / "journal", tmp_path / "out.jsonl"
    args = [
        "--recipe",
        recipe(tmp_path / "r.json", journal, sleep_s=0.05),
        "--input",
        tmp_path / "in.jsonl",
    ]
    proc = start(*args, "--output", out, "--batch-size", "50")
    wait_for_rows(out, 400, proc)
    proc.kill()  # kill -9: no cleanup in the CLI at all
    proc.communicate(timeout=30)
    _, before = output_rows(out)
    resumed = score(*args, "--output", out, "--batch-size", "50", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(before)} already done" in resumed.stderr
    _, after = output_rows(out)
    # one output row per input row, in order
    assert [r["id"] for r in after] == [r["id"] for r in rows]
    calls = [ids for _, ids in journal_calls(str(journal))]
    scored = [item for ids in calls for item in ids]
    twice = {item for item in scored if scored.count(item) > 1}
    assert set(scored) == {r["id"] for r in rows}
    assert not twice & {r["id"] for r in before}  # nothing written before the kill was scored again
    assert len(twice) <= 50  # at most the batch that was in flight when the kill came


@pytest.mark.slow
def test_ctrl_c_leaves_a_valid_resumable_output(tmp_path):
    rows = write_rows(tmp_path / "in.jsonl", 600)
    journal, out = tmp_path / "journal", tmp_path / "out.jsonl"
    args = [
        "--recipe",
        recipe(tmp_path / "r.json", journal, sleep_s=0.05),
        "--input",
        tmp_path / "in.jsonl",
    ]
    proc = start(*args, "--output", out, "--batch-size", "50")
    wait_for_rows(out, 150, proc)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "rerun with --resume" in stderr
    for line in out.read_text().splitlines():
        json.loads(line)  # every line whole
    resumed = score(*args, "--output", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert [r["id"] for r in output_rows(out)[1]] == [r["id"] for r in rows]


@pytest.mark.slow
def test_resume_under_another_scorer_revision_is_refused(tmp_path):
    write_rows(tmp_path / "in.jsonl", 20)
    out, journal = tmp_path / "out.jsonl", tmp_path / "journal"
    first = score(
        "--recipe",
        recipe(tmp_path / "a.json", journal),
        "--input",
        tmp_path / "in.jsonl",
        "--output",
        out,
    )
    assert first.returncode == 0, first.stderr
    before = out.read_text()
    other = recipe(tmp_path / "b.json", journal, probe="ProbeV2")
    refused = score(
        "--recipe", other, "--input", tmp_path / "in.jsonl", "--output", out, "--resume"
    )
    assert refused.returncode == 2
    assert "was scored by identity" in refused.stderr and "probe-v2" in refused.stderr
    assert out.read_text() == before  # untouched
    again = score(
        "--recipe",
        recipe(tmp_path / "a.json", journal),
        "--input",
        tmp_path / "in.jsonl",
        "--output",
        out,
    )
    # never overwritten by accident
    assert again.returncode == 2 and "pass --resume" in again.stderr


@pytest.mark.slow
def test_malformed_input_is_named_by_line_before_anything_is_scored(tmp_path):
    write_rows(tmp_path / "in.jsonl", 5)
    lines = (tmp_path / "in.jsonl").read_text().splitlines()
    cases = {
        "not JSON": lines[:2] + ['{"id": "x", "response": '] + lines[3:],
        "a row must be a JSON object": lines[:2] + ["[1, 2]"] + lines[3:],
        "no text in column 'response'": lines[:2] + ['{"id": "x", "answer": "1"}'] + lines[3:],
        "id 'r1' was already used on line 2": lines[:2] + [lines[1]] + lines[3:],
    }
    for message, content in cases.items():
        (tmp_path / "bad.jsonl").write_text("\n".join(content) + "\n")
        done = score(
            "--recipe",
            recipe(tmp_path / "r.json"),
            "--input",
            tmp_path / "bad.jsonl",
            "--output",
            tmp_path / "o",
        )
        assert done.returncode == 2 and f"bad.jsonl:3: {message}" in done.stderr, (
            message,
            done.stderr,
        )
        assert not (tmp_path / "o").exists()


def test_a_refused_row_gets_its_error_and_no_reward_while_its_batch_mates_are_scored(tmp_path):
    texts = ["a", "bb", "poison", "dddd", "eeeee", "ffffff", "g"]
    (tmp_path / "in.jsonl").write_text(
        "".join(json.dumps({"id": f"t{i}", "response": t}) + "\n" for i, t in enumerate(texts))
    )
    panel = {"reward": {"models": {"m": {"backend": "local",
                                         "scorer": "tests.helpers.fixture_scorers:RefusesText"}},
                        "reward_functions": {"len": {"model": "m"}}}}  # fmt: skip
    (tmp_path / "r.json").write_text(json.dumps(panel))
    done = score(
        "--recipe",
        tmp_path / "r.json",
        "--input",
        tmp_path / "in.jsonl",
        "--output",
        tmp_path / "out.jsonl",
    )
    assert done.returncode == 1, done.stderr  # rows with errors: not a clean run
    _, out = output_rows(tmp_path / "out.jsonl")
    assert [r["id"] for r in out] == [f"t{i}" for i in range(len(texts))]
    assert [r["reward"] for r in out] == [1.0, 2.0, None, 4.0, 5.0, 6.0, 1.0]
    assert "is poison" in out[2]["error"] and all(
        r["error"] is None for i, r in enumerate(out) if i != 2
    )
    (tmp_path / "all.jsonl").write_text(
        "".join(json.dumps({"id": f"p{i}", "response": "poison"}) + "\n" for i in range(4))
    )
    stopped = score(
        "--recipe",
        tmp_path / "r.json",
        "--input",
        tmp_path / "all.jsonl",
        "--output",
        tmp_path / "o2",
    )
    assert (
        stopped.returncode == 1 and "rows or groups in a row failed on their own" in stopped.stderr
    )
    assert not (tmp_path / "o2").exists()  # the run stopped before any row: no output, no sidecar
    assert not (tmp_path / "o2.meta.json").exists()


def test_image_paths_are_read_relative_to_the_input_file(tmp_path):
    from PIL import Image

    (tmp_path / "imgs").mkdir()
    flat = np.full((32, 32, 3), 90, np.uint8)
    noisy = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(flat).save(tmp_path / "imgs" / "flat.png")
    Image.fromarray(noisy).save(tmp_path / "imgs" / "noisy.png")
    rows = [
        {"id": "f", "image": "imgs/flat.png", "prompt": "grey"},
        {"id": "n", "image": "imgs/noisy.png"},
    ]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    panel = {"reward": {"models": {"j": {"backend": "local", "scorer": "mean_intensity",
                                         "input_kind": "image"}},
                        "reward_functions": {"mean": {"model": "j"}}}}  # fmt: skip
    (tmp_path / "r.json").write_text(json.dumps(panel))
    args = [
        "--recipe",
        tmp_path / "r.json",
        "--input",
        tmp_path / "in.jsonl",
        "--image-column",
        "image",
    ]
    done = score(*args, "--output", tmp_path / "out.jsonl")
    assert done.returncode == 0, done.stderr
    _, out = output_rows(tmp_path / "out.jsonl")
    assert [r["reward"] for r in out] == pytest.approx([90 / 255, noisy.mean() / 255])
    (tmp_path / "in.jsonl").write_text(json.dumps({"id": "x", "image": "imgs/missing.png"}) + "\n")
    missing = score(*args, "--output", tmp_path / "o2.jsonl")
    assert (
        missing.returncode == 2
        and "in.jsonl:1: column 'image' must name an image file" in missing.stderr
    )


def probe_recipe(path: Path, journal: Path) -> Path:
    panel = {"models": {"p": {"backend": "local", "scorer": "tests.helpers.fixture_scorers:Probe",
                              "params": {"journal": str(journal)}}},
             "reward_functions": {"len": {"model": "p"}}}  # fmt: skip
    path.write_text(json.dumps({"reward": panel}))
    return path


def test_resume_refuses_another_input_other_columns_and_files_it_did_not_write(tmp_path):
    rows = [{"response": "x" * (i + 1)} for i in range(6)]  # no id column: ids are line numbers
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe_path, out = (
        probe_recipe(tmp_path / "r.json", tmp_path / "journal"),
        tmp_path / "out.jsonl",
    )
    assert (
        score("--recipe", recipe_path, "--input", tmp_path / "a.jsonl", "--output", out).returncode
        == 0
    )
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:3]))  # as if stopped after three rows
    changed = rows[:1] + [{"response": "other"}] + rows[2:]
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in changed))
    refused = score(
        "--recipe", recipe_path, "--input", tmp_path / "b.jsonl", "--output", out, "--resume"
    )
    assert refused.returncode == 2 and "row 2 ('line-2') is not input line 2" in refused.stderr, (
        refused.stderr
    )
    other_columns = score(
        "--recipe",
        recipe_path,
        "--input",
        tmp_path / "a.jsonl",
        "--output",
        out,
        "--resume",
        "--prompt-column",
        "q",
    )
    assert other_columns.returncode == 2 and "was written with columns" in other_columns.stderr
    assert out.read_text() == "".join(lines[:3])  # untouched by both
    for name, content in {
        "single.json": '{"important": "data"}',
        "notes.txt": "hello world\n",
    }.items():
        (tmp_path / name).write_text(content)
        stranger = score(
            "--recipe",
            recipe_path,
            "--input",
            tmp_path / "a.jsonl",
            "--output",
            tmp_path / name,
            "--resume",
        )
        assert (
            stranger.returncode == 2
            and "is not an output of managed-scorers score" in stranger.stderr
        )
        assert (tmp_path / name).read_text() == content
    resumed = score(
        "--recipe", recipe_path, "--input", tmp_path / "a.jsonl", "--output", out, "--resume"
    )
    assert resumed.returncode == 0, resumed.stderr
    assert [r["reward"] for r in output_rows(out)[1]] == [float(i + 1) for i in range(6)]


def test_resume_rescores_a_group_a_torn_write_cut_short_as_a_whole_group(tmp_path):
    rows = [
        {"id": f"g{g}-{k}", "g": f"g{g}", "response": "x" * (k + 1)}
        for g in range(3)
        for k in range(4)
    ]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    journal, out = tmp_path / "journal", tmp_path / "out.jsonl"
    args = [
        "--recipe",
        probe_recipe(tmp_path / "r.json", journal),
        "--input",
        tmp_path / "in.jsonl",
    ]
    assert score(*args, "--output", out, "--group-column", "g", "--batch-size", "4").returncode == 0
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:6]) + lines[6][:10])  # a group and a half, then a torn line
    journal.unlink()
    resumed = score(*args, "--output", out, "--group-column", "g", "--batch-size", "4", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert [r["id"] for r in output_rows(out)[1]] == [r["id"] for r in rows]
    assert [ids for _, ids in journal_calls(str(journal))] == [
        [f"g{g}-{k}" for k in range(4)] for g in (1, 2)
    ]


def test_rows_a_reward_item_would_refuse_are_named_by_line_before_any_child_starts(tmp_path):
    recipe_path = probe_recipe(tmp_path / "r.json", tmp_path / "journal")
    good = {"id": "a", "response": "x", "g": "1"}
    cases = {
        # chat messages are read (test_cli_score_formats.py)
        "prompt": ({**good, "id": "c", "prompt": 3}, []),
        "finite": ({**good, "id": "c", "reference": float("nan")}, []),
        "column 'g' must hold a group": ({"id": "b", "response": "y"}, ["--group-column", "g"]),
        "group '1' began on line 1": ({**good, "id": "c"}, ["--group-column", "g"]),
    }
    for message, (row, extra) in cases.items():
        lines = [good, {"id": "z", "response": "z", "g": "2"}, row]
        (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        done = score(
            "--recipe",
            recipe_path,
            "--input",
            tmp_path / "in.jsonl",
            "--output",
            tmp_path / "o",
            *extra,
        )
        assert done.returncode == 2 and "in.jsonl:3: " in done.stderr and message in done.stderr, (
            message,
            done.stderr,
        )
        assert not (tmp_path / "o").exists() and not (tmp_path / "journal").exists()


def test_retry_errors_scores_the_error_rows_again_in_place(tmp_path):
    texts = ["a", "poison", "ccc", "dd"]
    (tmp_path / "in.jsonl").write_text(
        "".join(json.dumps({"id": f"t{i}", "response": t}) + "\n" for i, t in enumerate(texts))
    )
    outage = tmp_path / "outage"
    outage.write_text("the scorer refuses 'poison' while this file exists")
    params = {"poison": "poison", "while_exists": str(outage)}
    models = {
        "m": {
            "backend": "local",
            "scorer": "tests.helpers.fixture_scorers:RefusesText",
            "params": params,
        }
    }
    recipe_path = tmp_path / "r.json"
    recipe_path.write_text(
        json.dumps({"reward": {"models": models, "reward_functions": {"len": {"model": "m"}}}})
    )
    out, args = tmp_path / "out.jsonl", ["--recipe", recipe_path, "--input", tmp_path / "in.jsonl"]
    first = score(*args, "--output", out)
    assert first.returncode == 1 and [r["reward"] for r in output_rows(out)[1]] == [
        1.0,
        None,
        3.0,
        2.0,
    ]
    alone = score(*args, "--output", out, "--retry-errors")
    assert alone.returncode == 2 and "goes with --resume" in alone.stderr
    plain = score(*args, "--output", out, "--resume")  # a plain resume keeps the error row as it is
    assert plain.returncode == 0 and output_rows(out)[1][1]["reward"] is None
    outage.unlink()  # the transient failure is over
    again = score(*args, "--output", out, "--resume", "--retry-errors")
    assert again.returncode == 0 and "1 of them scored again" in again.stderr, again.stderr
    header, rows = output_rows(out)
    assert [r["id"] for r in rows] == ["t0", "t1", "t2", "t3"] and [r["reward"] for r in rows] == [
        1.0,
        6.0,
        3.0,
        2.0,
    ]
    assert not list(tmp_path.glob(".out.jsonl.*.tmp"))


def test_a_failed_optional_term_is_recorded_counted_retried_and_not_a_clean_exit(tmp_path):
    """The optional term fails for the batch: each row keeps the reward of the other terms, says
    which term it lacks and why (its null component is not "not applicable"), the run exits 1, and
    --retry-errors scores those rows again once the term works."""
    (tmp_path / "in.jsonl").write_text(
        "".join(
            json.dumps({"id": f"t{i}", "response": t}) + "\n"
            for i, t in enumerate(["a", "poison", "ccc"])
        )
    )
    outage = tmp_path / "outage"
    outage.write_text("the optional term refuses 'poison' while this file exists")
    models = {
        "len": {"backend": "local", "scorer": "tests.helpers.fixture_scorers:Probe"},
        "picky": {
            "backend": "local",
            "scorer": "tests.helpers.fixture_scorers:RefusesText",
            "params": {"while_exists": str(outage)},
        },
    }
    functions = {
        "len": {"model": "len"},
        "picky": {"model": "picky", "required": False, "weight": 10.0},
    }
    (tmp_path / "r.json").write_text(
        json.dumps({"reward": {"models": models, "reward_functions": functions}})
    )
    out, args = (
        tmp_path / "out.jsonl",
        ["--recipe", tmp_path / "r.json", "--input", tmp_path / "in.jsonl"],
    )
    first = score(*args, "--output", out)
    assert first.returncode == 1 and "3 missing a failed optional term" in first.stderr, (
        first.stderr
    )
    rows = output_rows(out)[1]
    assert [r["reward"] for r in rows] == [1.0, 6.0, 3.0] and all(r["error"] is None for r in rows)
    assert all(
        r["components"]["picky"] is None and "is poison" in r["failed_terms"]["picky"] for r in rows
    )
    outage.unlink()
    again = score(*args, "--output", out, "--resume", "--retry-errors")
    assert again.returncode == 0 and "3 of them scored again" in again.stderr, again.stderr
    assert [(r["reward"], r["failed_terms"]) for r in output_rows(out)[1]] == [
        (11.0, {}),
        (66.0, {}),
        (33.0, {}),
    ]


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header says width x height, with no pixels after it."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


def local_recipe(
    path: Path, scorer: str = "tests.helpers.fixture_scorers:Probe", kind: str = "text", **panel
) -> Path:
    models = {"m": {"backend": "local", "scorer": scorer, "input_kind": kind}}
    path.write_text(
        json.dumps(
            {"reward": {"models": models, "reward_functions": {"t": {"model": "m"}}, **panel}}
        )
    )
    return path


def test_input_that_would_break_the_run_is_named_by_line_before_anything_starts(tmp_path):
    """Exit 2 naming file:line, no output written: bytes that are not UTF-8, a number past Python's
    digit limit, brackets nested past the recursion limit, a PNG header claiming 20000 x 20000, and
    the groups the scorers would refuse after boot (one of 2 rows where 4 are declared, a reference
    missing from one row of a group)."""
    (tmp_path / "huge.png").write_bytes(png_claiming(20000, 20000))
    good = json.dumps({"id": "a", "response": "x", "image": "huge.png", "g": "1", "reference": "1"})
    cases = {
        "not UTF-8": (b'{"id": "b", "response": "\xff\xfe"}', {}),
        "not readable JSON (ValueError": (
            b'{"id": "b", "response": "x", "n": ' + b"9" * 5000 + b"}",
            {},
        ),
        "not readable JSON (RecursionError": (
            b'{"id": "b", "response": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            {},
        ),
        "DecompressionBombError": (good.replace('"a"', '"b"').encode(), {"image": True}),
        "group '1' has 2 rows": (
            json.dumps({"id": "b", "response": "y", "g": "1", "reference": "1"}).encode(),
            {"size": 4},
        ),
        "column 'reference' differs from line 1": (
            json.dumps({"id": "b", "response": "y", "g": "1"}).encode(),
            {},
        ),
    }
    for message, (line, how) in cases.items():
        first = good if how.get("image") else good.replace(', "image": "huge.png"', "")
        (tmp_path / "in.jsonl").write_bytes(first.encode() + b"\n" + line + b"\n")
        options = {"group_size": how["size"]} if "size" in how else {}
        args = [
            "--recipe",
            local_recipe(tmp_path / "r.json", **options),
            "--input",
            tmp_path / "in.jsonl",
        ]
        args += ["--group-column", "g"] + (["--image-column", "image"] if how.get("image") else [])
        done = score(*args, "--output", tmp_path / "o")
        line_no = 1 if how.get("image") or "size" in how else 2
        assert (
            done.returncode == 2
            and f"in.jsonl:{line_no}: " in done.stderr
            and message in done.stderr
        ), (
            message,
            done.stderr,
        )
        assert "Traceback" not in done.stderr and not (tmp_path / "o").exists()


def test_an_image_that_opens_but_does_not_decode_fails_its_row_and_resume_gets_past_it(tmp_path):
    from PIL import Image

    Image.fromarray(np.full((64, 64, 3), 90, np.uint8)).save(tmp_path / "ok.png")
    whole = (tmp_path / "ok.png").read_bytes()
    # its header opens; its pixels are cut short
    (tmp_path / "cut.png").write_bytes(whole[: len(whole) // 2])
    rows = [{"id": f"r{i}", "image": "cut.png" if i == 1 else "ok.png"} for i in range(4)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    recipe_path = local_recipe(tmp_path / "r.json", "mean_intensity", "image")
    args = ["--recipe", recipe_path, "--input", tmp_path / "in.jsonl", "--image-column", "image"]
    done = score(*args, "--output", tmp_path / "out.jsonl")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    out = output_rows(tmp_path / "out.jsonl")[1]
    assert [r["reward"] is None for r in out] == [False, True, False, False]
    assert "input line 2: cannot decode its image" in out[1]["error"]
    again = score(*args, "--output", tmp_path / "out.jsonl", "--resume")
    assert again.returncode == 0 and "0 rows scored" in again.stderr, again.stderr


def test_a_second_run_on_the_same_output_is_refused_and_a_symlinked_output_too(tmp_path):
    (tmp_path / "in.jsonl").write_text(
        "".join(json.dumps({"id": f"t{i}", "response": "x" * i}) + "\n" for i in range(6))
    )
    hold = tmp_path / "hold"  # the first run waits after its first row while this file exists
    hold.touch()
    models = {
        "m": {
            "backend": "local",
            "scorer": "tests.helpers.fixture_scorers:Probe",
            "params": {"hold": str(hold)},
        }
    }
    (tmp_path / "r.json").write_text(
        json.dumps({"reward": {"models": models, "reward_functions": {"t": {"model": "m"}}}})
    )
    out, args = (
        tmp_path / "out.jsonl",
        ["--recipe", tmp_path / "r.json", "--input", tmp_path / "in.jsonl"],
    )
    first = start(*args, "--output", out, "--batch-size", "1")
    try:
        wait_for_rows(out, 1, first)
        for extra in ([], ["--resume"]):
            second = score(*args, "--output", out, *extra)
            assert second.returncode == 2, second.stderr
            assert (
                "being written by another managed-scorers score run" in second.stderr
                or "exists" in second.stderr
            )
        hold.unlink()
        assert first.wait(60) == 0, first.communicate()
    finally:
        first.kill()
        first.communicate()
    # none lost, none twice
    assert [r["reward"] for r in output_rows(out)[1]] == [float(i) for i in range(6)]
    (tmp_path / "link.jsonl").symlink_to(out)
    linked = score(*args, "--output", tmp_path / "link.jsonl", "--resume")
    assert linked.returncode == 2 and "is a symbolic link" in linked.stderr, linked.stderr


def test_a_recipe_whose_env_is_not_built_is_one_line_and_exit_2(tmp_path):
    write_rows(tmp_path / "in.jsonl", 3)
    args = [
        "--recipe",
        recipe(tmp_path / "r.json"),
        "--input",
        tmp_path / "in.jsonl",
        "--output",
        tmp_path / "o",
    ]
    done = subprocess.run(
        [*CLI, *map(str, args)],
        env={**ENV, "MANAGED_SCORERS_ENVS": str(tmp_path / "no-envs")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        done.returncode == 2
        and "Traceback" not in done.stderr
        and len(done.stderr.splitlines()) == 1
    ), done.stderr
    assert (
        "scorer env 'math' is not built" in done.stderr
        and "managed-scorers envs build math" in done.stderr
    )
    assert not (tmp_path / "o").exists()


def write_wav(path: Path, frames: np.ndarray, width: int, rate: int = 16000) -> Path:
    """PCM samples (frames, channels) of `width` bytes, written by the stdlib as any tool would."""
    import wave

    if width == 3:  # little-endian 24-bit: the low three bytes of each int32
        data = frames.astype("<i4").reshape(-1, 1).view(np.uint8)[:, :3].tobytes()
    else:
        data = frames.astype({1: "u1", 2: "<i2", 4: "<i4"}[width]).tobytes()
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(frames.shape[1])
        handle.setsampwidth(width)
        handle.setframerate(rate)
        handle.writeframes(data)
    return path


def float_wav(path: Path, code: int = 3, bits: int = 32) -> Path:
    """A mono WAV whose header is written by hand: IEEE float (format 3) of 0.5 by default, as
    torchaudio writes; `code` 2 is ADPCM, which is not read."""
    import struct

    samples = np.full(4, 0.5, "<f4").tobytes()
    fmt = struct.pack("<HHIIHH", code, 1, 16000, 16000 * bits // 8, bits // 8, bits)
    body = (
        b"WAVE"
        + b"fmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + b"data"
        + struct.pack("<I", len(samples))
        + samples
    )
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    return path


def test_an_audio_column_of_pcm_and_float_wavs_is_scored_by_hand_and_an_adpcm_wav_is_refused_by_line(  # noqa: E501
    tmp_path,
):
    # 0.5 on both channels: -6.02 dBFS
    write_wav(tmp_path / "s16.wav", np.full((800, 2), 1 << 14), 2)
    write_wav(tmp_path / "s24.wav", np.full((800, 1), -(1 << 21)), 3)  # -0.25: -12.04 dBFS
    write_wav(tmp_path / "u8.wav", np.full((80, 1), 128 + 64), 1)  # 0.5: -6.02 dBFS
    write_wav(tmp_path / "s32.wav", np.zeros((8, 3), np.int64), 4)  # silence: the -100 dBFS floor
    float_wav(tmp_path / "f32.wav")  # 0.5: -6.02 dBFS
    names = ["s16.wav", "s24.wav", "u8.wav", "s32.wav", "f32.wav"]
    (tmp_path / "in.jsonl").write_text(
        "".join(json.dumps({"id": n, "wav": n}) + "\n" for n in names)
    )
    recipe_path = local_recipe(tmp_path / "r.json", "audio_loudness", "audio")
    args = ["--recipe", recipe_path, "--input", tmp_path / "in.jsonl", "--audio-column", "wav"]
    done = score(*args, "--output", tmp_path / "out.jsonl")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    header, out = output_rows(tmp_path / "out.jsonl")
    assert header["columns"]["audio"] == "wav"
    half, quarter = -abs(20 * np.log10(0.5) + 20), -abs(20 * np.log10(0.25) + 20)
    assert [r["reward"] for r in out] == pytest.approx([half, quarter, half, -80.0, half], abs=1e-9)
    float_wav(tmp_path / "adpcm.wav", code=2, bits=4)
    (tmp_path / "in.jsonl").write_text(json.dumps({"id": "a", "wav": "adpcm.wav"}) + "\n")
    refused = score(*args, "--output", tmp_path / "o2.jsonl")
    assert (
        refused.returncode == 2
        and "in.jsonl:1:" in refused.stderr
        and "format 0x2" in refused.stderr
    )


def pcm_by_hand(
    path: Path, rate: int, channels: int = 1, frames: int = 80, cut: bool = False
) -> Path:
    """A 16-bit PCM WAV whose header says what it is given (the stdlib's writer refuses a 0 Hz
    rate); `cut`: the last frame the header claims is missing."""
    import struct

    samples = b"\x00\x10" * frames * channels
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * channels * 2, channels * 2, 16)
    body = (
        b"WAVE"
        + b"fmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + b"data"
        + struct.pack("<I", len(samples))
        + samples
    )
    whole = b"RIFF" + struct.pack("<I", len(body)) + body
    path.write_bytes(whole[: -2 * channels] if cut else whole)
    return path


def audio_rows(tmp_path: Path, odd: dict[int, str]) -> list[str | Path]:
    """Five rows of `ok.wav` but those `odd` names, and the arguments that score them."""
    pcm_by_hand(tmp_path / "ok.wav", 16000)
    wavs = [odd.get(i, "ok.wav") for i in range(5)]
    (tmp_path / "in.jsonl").write_text(
        "".join(json.dumps({"id": f"r{i}", "wav": w}) + "\n" for i, w in enumerate(wavs))
    )
    recipe_path = local_recipe(tmp_path / "r.json", "audio_loudness", "audio")
    return [
        "--recipe",
        recipe_path,
        "--input",
        tmp_path / "in.jsonl",
        "--audio-column",
        "wav",
        "--batch-size",
        "1",
    ]


@pytest.mark.slow
def test_a_wav_whose_header_reads_but_whose_audio_would_not_is_refused_by_line_before_anything_starts(  # noqa: E501
    tmp_path,
):
    """What decoding and the item will need, checked before any row is scored: a rate, the frames
    the header claims, what an item takes (at most 32 channels)."""
    cases = {
        "at 0 Hz": pcm_by_hand(tmp_path / "zero.wav", 0),
        "is cut short": pcm_by_hand(tmp_path / "cut.wav", 16000, cut=True),
        "(channels, samples) with 1..32 channels": pcm_by_hand(
            tmp_path / "wide.wav", 16000, channels=33
        ),
    }
    for message, wav in cases.items():
        args = audio_rows(tmp_path, {3: wav.name})
        done = score(*args, "--output", tmp_path / "o")
        assert done.returncode == 2 and "in.jsonl:4: " in done.stderr and message in done.stderr, (
            done.stderr
        )
        assert "Traceback" not in done.stderr and not (tmp_path / "o").exists(), message


# The pre-check skipped, as for files replaced between the check and their decoding.
UNCHECKED = [
    sys.executable,
    "-c",
    "import sys; import supervisor.ops.dataset_rows as rows; rows._check_audio = lambda *args: {}; "
    "from supervisor.ops.cli import main; sys.exit(main())",
    "score",
]


def test_audio_that_fails_to_decode_while_scoring_fails_its_row_the_run_goes_on_and_resume_gets_past_it(  # noqa: E501
    tmp_path,
):
    pcm_by_hand(tmp_path / "zero.wav", 0)
    pcm_by_hand(tmp_path / "cut.wav", 16000, cut=True)
    pcm_by_hand(tmp_path / "wide.wav", 16000, channels=33)  # a WAV, but no item's audio
    args = [
        *UNCHECKED,
        *map(str, audio_rows(tmp_path, {1: "zero.wav", 2: "wide.wav", 3: "cut.wav"})),
    ]
    output = ["--output", str(tmp_path / "out.jsonl")]
    done = subprocess.run([*args, *output], env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    rows = output_rows(tmp_path / "out.jsonl")[1]
    assert [r["reward"] is None for r in rows] == [False, True, True, True, False]
    assert (
        "input line 2: cannot decode its audio" in rows[1]["error"]
        and "at 0 Hz" in rows[1]["error"]
    )
    assert (
        "input line 3: its decoded media are refused" in rows[2]["error"]
        and "1..32 channels" in rows[2]["error"]
    )
    assert (
        "input line 4: cannot decode its audio" in rows[3]["error"]
        and "cut short" in rows[3]["error"]
    )
    again = subprocess.run(
        [*args, *output, "--resume"], env=ENV, capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0 and "0 rows scored" in again.stderr, again.stderr
