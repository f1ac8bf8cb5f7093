"""Installed use keeps the isolation: `pip install .` into a trainer env that pins antlr 4.9.3, run
from another directory, and the math child still grades `10\\%` as 0.1 with its own antlr 4.13.2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, env_python


@pytest.fixture(scope="session")
def installed_trainer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with managed-scorers installed from its built wheel, and antlr 4.9.3 beside
    it."""
    root = tmp_path_factory.mktemp("installed")
    # a copy, so that nothing can be imported from the checkout by accident
    source = root / "source"
    shutil.copytree(
        REPO_ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".venv", "envs", ".git", "__pycache__", "*.egg-info", "build", "bench", "tests"
        ),
    )
    venv = root / "trainer-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    wheels = root / "wheels"  # the built wheel, as a user would get it from an index
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-input",
            "--no-deps",
            "-w",
            str(wheels),
            str(source),
        ],
        check=True,
    )
    (wheel,) = wheels.glob("managed_scorers-*.whl")
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-input",
            str(wheel),
            "antlr4-python3-runtime==4.9.3",
        ],
        check=True,
    )
    shutil.rmtree(source)
    return python


@pytest.mark.slow
def test_an_installed_trainer_hands_the_child_nothing_of_its_environment(
    installed_trainer, tmp_path
):
    math_python = env_python("math")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = elsewhere / "train.py"
    shutil.copy(REPO_ROOT / "tests" / "helpers" / "installed_trainer.py", script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    done = subprocess.run(
        [str(installed_trainer), str(script), str(math_python)],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    trainer_env = installed_trainer.parent.parent
    # the installed copy, not the checkout
    assert Path(report["supervisor"]).is_relative_to(trainer_env)
    assert report["packages"]["antlr4-python3-runtime"] == "4.13.2"
    assert report["reward"] == 1.0
    root, *rest = (Path(entry) for entry in report["sys_path"])
    assert sorted(os.listdir(root)) == ["child_runtime", "scorers"]
    assert all(
        (root / name).resolve().is_relative_to(trainer_env) for name in ("child_runtime", "scorers")
    )
    math_env = math_python.parent.parent
    # the interpreter the math venv was made from
    base = Path(os.path.realpath(math_python)).parent.parent
    for entry in rest:  # the math env, and the standard library of the interpreter it was made from
        assert entry.is_relative_to(math_env) or entry.is_relative_to(base), entry
        assert not entry.is_relative_to(trainer_env) and not entry.is_relative_to(elsewhere), entry


USE_BY_NAME = """
import importlib.resources, json
import numpy as np
from supervisor import ManagedScorerProcessBackend, RewardItem, RewardRequest
from supervisor.adapters.ddpo import DDPORewardFn  # subpackages ship too

spec = {
    "scorer": {"name": "jpeg_compressibility", "input_kind": "image"},
    "client": {"input_kind": "image"},
}
with ManagedScorerProcessBackend(
    spec
) as backend:  # no python given: the env the scorer declares, by name
    flat = np.full((64, 64, 3), 128, np.uint8)
    reward = backend.compute_rewards(RewardRequest(items=[RewardItem(id="a", image=flat)])).rewards[
        0
    ]
    python = str(backend.spec.process.python_executable)
samples = importlib.resources.files("supervisor.ops").joinpath("demo_samples.json").is_file()
print(json.dumps({"reward": reward, "python": python, "samples": samples}))
"""


@pytest.mark.slow
def test_an_installed_package_builds_a_scorer_env_by_name_and_scores_from_elsewhere(
    installed_trainer, tmp_path
):
    """`managed-scorers envs build image` from the installed package (its shipped spec), into a root
    of the user's choosing; a spec that names no python then finds that env by the scorer's declared
    name."""
    root, elsewhere = tmp_path / "scorer-envs", tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["MANAGED_SCORERS_ENVS"] = str(root)
    cli = installed_trainer.parent / "managed-scorers"

    def run(*command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            command, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=timeout
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    run(str(cli), "envs", "build", "image", timeout=900)
    listing = {
        line.split()[0]: line for line in run(str(cli), "envs", "list").stdout.splitlines()[1:]
    }
    assert "built" in listing["image"] and "pillow==13.0.0" in listing["image"]
    assert "not built" in listing["math"]
    # pins unchanged: nothing rebuilt
    assert "up to date" in run(str(cli), "envs", "build", "image").stderr
    report = json.loads(run(str(installed_trainer), "-c", USE_BY_NAME).stdout.splitlines()[-1])
    assert report["python"] == str(root / "image" / ".venv" / "bin" / "python")
    assert report["reward"] < 0 and report["samples"] is True


@pytest.mark.slow
def test_the_wheel_ships_example_recipes_that_name_their_envs(installed_trainer, tmp_path):
    """`managed-scorers recipes` lists the recipes the package ships; one printed from another
    directory parses there against the envs by name (no path into a checkout)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["MANAGED_SCORERS_ENVS"] = str(REPO_ROOT / "envs")
    cli = [str(installed_trainer), "-m", "supervisor", "recipes"]
    listed = subprocess.run(cli, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert (
        listed.returncode == 0 and "verl_omni" in listed.stdout and "unirl_targets" in listed.stdout
    ), listed.stderr
    for name in ("verl_omni", "unirl_targets"):
        text = subprocess.run(
            [*cli, name], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert text.returncode == 0, text.stderr
        (tmp_path / f"{name}.yaml").write_text(text.stdout)
        check = (
            "import sys; from supervisor import load_recipe; "
            "print(len(load_recipe(sys.argv[1]).train.terms))"
        )
        parsed = subprocess.run(
            [str(installed_trainer), "-c", check, f"{name}.yaml"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
        )
        assert parsed.returncode == 0 and int(parsed.stdout) >= 2, parsed.stderr


@pytest.mark.slow
def test_the_installed_demo_grades_in_the_child_and_says_what_it_did_not_measure(
    installed_trainer, tmp_path
):
    """`managed-scorers demo` from the wheel, elsewhere: the child's verdicts; this venv has antlr
    4.9.3 but no math-verify, so the in-process column is not measured and the demo says so, with
    the way to measure it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["MANAGED_SCORERS_ENVS"] = str(REPO_ROOT / "envs")  # the math env make test built
    cli = installed_trainer.parent / "managed-scorers"
    done = subprocess.run(
        [str(cli), "demo"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stdout + done.stderr
    pct = next(line.split() for line in done.stdout.splitlines() if line.startswith("  pct "))
    # gold, the child's verdict, nothing pretended in-process
    assert pct[-3:] == ["0.1", "1.0", "-"]
    said = " ".join(done.stdout.split())
    assert f"managed child: {REPO_ROOT / 'envs' / 'math' / '.venv'}: math-verify 0.9.0" in said
    assert f"in-process: not measured: this python ({installed_trainer}" in said
    assert "`pip install hydra-core==1.3.2 math-verify==0.9.0`" in said
