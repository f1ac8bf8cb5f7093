"""Every code block of README.md and docs/**/*.md, one case each (`README.md:123`), checked by the
rules of tests/docs/snippets.py (said for authors in docs/contributing.md); and the runner itself
shown to fail on broken examples, each failure naming its file and line."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.conftest import wait_until_gone
from tests.docs.snippets import (
    JSON,
    PYTHON,
    SHELL,
    YAML,
    Block,
    SnippetFailed,
    SnippetSkipped,
    blocks_of,
    check,
    collect,
    console_commands,
)

BLOCKS = collect()


def _param(block: Block) -> object:
    runs = block.problem is None and block.marker is None and block.lang in PYTHON | SHELL
    return pytest.param(block, id=block.id, marks=[pytest.mark.slow] if runs else [])


@pytest.mark.parametrize("block", [_param(block) for block in BLOCKS])
def test_snippet(block: Block, tmp_path: Path) -> None:
    skipped = failed = None
    try:
        check(block, tmp_path)
    except SnippetSkipped as exc:
        skipped = str(exc)
    except SnippetFailed as exc:
        failed = str(exc)
    # outside the except clause: the report shows the block's error, not a chain
    if failed is not None:
        pytest.fail(failed, pytrace=False)
    if skipped is not None:
        pytest.skip(skipped)


def test_the_docs_have_blocks_to_check() -> None:
    """The collector finds the pages' blocks (a collector that finds none would pass everything)."""
    checked = [b for b in BLOCKS if b.lang in PYTHON | SHELL | YAML | JSON]
    assert len(checked) >= 10, [b.id for b in BLOCKS]


BROKEN = """\
# A page with broken examples

```python
print("this one works")
```

```python
raise RuntimeError("this example is broken")
```

<!-- not run -->
```bash
echo "a marker without a reason"
```

```yaml
terms: []
```

<!-- not run: needs a GPU -->
```python
raise SystemExit("never run: the marker says why")
```

```json
{"trailing": "comma",}
```

```bash
false
```

<!-- not run: the marker is one blank line too far from its fence -->

```text
not run
```

```python
import time
time.sleep(30)
```

```python
import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
```

```bash
echo "a result" > left-behind.txt
```
"""


def test_the_runner_fails_on_broken_examples(tmp_path: Path) -> None:
    # a git repo: a shell block runs in its root, and must leave no file there
    root = tmp_path / "repo"
    page = root / "docs" / "broken.md"
    page.parent.mkdir(parents=True)
    page.write_text(BROKEN)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    blocks = blocks_of(page, root)
    outcomes: dict[str, str] = {}
    for block in blocks:
        workdir = tmp_path / f"run-{block.line}"
        workdir.mkdir()
        try:
            outcomes[block.id] = "ok: " + check(block, workdir, root=root, python_deadline_s=3.0)
        except SnippetSkipped as skipped:
            outcomes[block.id] = f"skipped: {skipped}"
        except SnippetFailed as failed:
            assert str(failed).startswith(f"{block.id}: "), failed  # names the file and the line
            outcomes[block.id] = f"failed: {failed}"
    said = {where: outcome.splitlines()[0] for where, outcome in outcomes.items()}
    expected = {
        "docs/broken.md:3": "ok: ran in",
        "docs/broken.md:7": "failed: docs/broken.md:7: python block exited 1",
        "docs/broken.md:12": "failed: docs/broken.md:12: `<!-- not run -->` needs a reason",
        "docs/broken.md:16": "failed: docs/broken.md:16: not a recipe load_recipe accepts "
        "(ConfigError",
        "docs/broken.md:21": "skipped: docs/broken.md:21: not run: needs a GPU",
        "docs/broken.md:25": "failed: docs/broken.md:25: JSON does not parse",
        "docs/broken.md:29": "failed: docs/broken.md:29: bash block exited 1",
        "docs/broken.md:33": "failed: docs/broken.md:33: the marker",
        "docs/broken.md:35": "ok: not run (text)",
        "docs/broken.md:39": "failed: docs/broken.md:39: python block ran past its 3 s deadline",
        "docs/broken.md:44": "failed: docs/broken.md:44: processes outlived the block by 5 s "
        "(killed): pid",
        "docs/broken.md:49": "failed: docs/broken.md:49: the block left files in the repo: "
        "left-behind.txt",
    }
    assert set(said) == set(expected), said
    for where, start in expected.items():
        assert said[where].startswith(start), (where, said[where])
    # the error is shown
    assert "RuntimeError: this example is broken" in outcomes["docs/broken.md:7"]
    leaked_pid = int(said["docs/broken.md:44"].split("pid ")[1].split(":")[0])
    assert not wait_until_gone([leaked_pid], 5.0), "the runner left the leaked process alive"


def test_a_console_block_runs_its_prompted_lines_only() -> None:
    block = "$ echo one \\\n    two\none two\n$ true\n"
    assert console_commands(block) == "echo one \\\n    two\ntrue\n"
    assert console_commands("echo plain\n") == "echo plain\n"


def test_the_runner_runs_python_blocks_with_the_repo_and_its_envs(tmp_path: Path) -> None:
    """What a python block sees: a fresh cwd, the repo importable, the scorer envs named."""
    code = textwrap.dedent(
        """
        import os, pathlib
        import tests.helpers

        assert pathlib.Path.cwd() != pathlib.Path(tests.helpers.__file__).parent.parent.parent
        assert os.environ["MANAGED_SCORERS_ENVS"].endswith("/envs"), os.environ[
            "MANAGED_SCORERS_ENVS"
        ]
        """
    )
    page = tmp_path / "README.md"
    page.write_text(f"```python\n{code}```\n")
    (block,) = blocks_of(page, tmp_path)
    assert check(block, tmp_path, root=Path(__file__).resolve().parent.parent.parent).startswith(
        "ran in"
    )


def test_a_block_whose_children_end_within_the_grace_passes(tmp_path: Path) -> None:
    """A background job that ends soon after its block is no leak (a child's graceful exit takes a
    moment)."""
    page = tmp_path / "README.md"
    page.write_text("```bash\nsleep 0.5 &\necho started\n```\n")
    (block,) = blocks_of(page, tmp_path)
    assert check(block, tmp_path).startswith("ran in")
