"""Scorer envs by name: the shipped specs, `managed-scorers envs build/list/path`, stamps that never lie."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor import scorer_envs
from supervisor.ops import env_builder
from supervisor.ops.cli import main
from supervisor.scorer_envs import EnvError
from tests.conftest import REPO_ROOT

CLI = [sys.executable, "-m", "supervisor"]


def fake_env(root: Path, name: str, stamp: str | None) -> Path:
    """A venv-shaped folder (a python link, a stamp, one package's metadata), built in no time."""
    venv = root / name / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    dist = venv / "lib" / "python3.11" / "site-packages" / "pillow-13.0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pillow\nVersion: 13.0.0\n")
    if stamp is not None:
        (venv / scorer_envs.STAMP).write_text(stamp + "\n")
    return venv


def test_the_package_ships_a_spec_for_every_env_a_builtin_scorer_declares():
    from scorers.registry import BUILTINS, resolve_scorer

    declared = {resolve_scorer(name).spec.env for name in BUILTINS} - {None}
    assert declared <= set(scorer_envs.spec_names()) == {"embed", "image", "math", "ocr"}
    assert "antlr4-python3-runtime==4.13.2" in env_builder.requirement_lines(scorer_envs.spec_path("math"))
    assert env_builder.key_packages(scorer_envs.spec_path("image")) == ["pillow", "numpy", "httpx"]


def test_the_stamp_ignores_comments_and_follows_an_editable_projects_pyproject(tmp_path):
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "pyproject.toml").write_text("[project]\nname='a'\n")
    spec = tmp_path / "spec.txt"
    spec.write_text("# a comment\nfoo==1.0  # why\n-e proj\n")
    first = env_builder.spec_hash(spec)
    spec.write_text("# another comment\nfoo==1.0\n\n-e proj\n")
    assert env_builder.spec_hash(spec) == first
    (tmp_path / "proj" / "pyproject.toml").write_text("[project]\nname='a'\ndependencies=['x']\n")
    assert env_builder.spec_hash(spec) != first


def test_a_no_deps_line_is_part_of_the_stamp_and_names_what_pip_check_may_excuse():
    """The trainer env installs verl, OpenRLHF and UniRL without their declared dependencies."""
    trainer_spec = REPO_ROOT / "envs" / "trl" / "requirements.txt"
    assert env_builder.no_deps_lines(trainer_spec) == ["verl==0.9.1", "openrlhf==0.11.2", "unirl==0.2.0"]
    assert not any(
        line.startswith(("verl", "openrlhf", "unirl")) for line in env_builder.requirement_lines(trainer_spec)
    )


def test_pip_check_is_excused_only_for_the_packages_installed_without_dependencies(tmp_path):
    complain = "import sys; print('verl 0.9.1 requires peft, which is not installed.'); print(sys.argv[1]); sys.exit(1)"
    fake_pip = [sys.executable, "-c", complain]
    env_builder._check([*fake_pip, "unirl 0.2.0 requires diffusers"], tmp_path, {"verl", "unirl"})
    with pytest.raises(EnvError, match="trl 1.16.0 requires"):
        env_builder._check([*fake_pip, "trl 1.16.0 requires accelerate"], tmp_path, {"verl", "unirl"})


def test_envs_list_tells_built_not_built_and_changed_pins(tmp_path, capsys):
    fake_env(tmp_path, "image", env_builder.spec_hash(scorer_envs.spec_path("image")))
    fake_env(tmp_path, "math", "0" * 64)  # built from other pins
    assert main(["envs", "list", "--root", str(tmp_path)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert "built" in lines["image"] and "pillow==13.0.0" in lines["image"] and "numpy==?" in lines["image"]
    assert "pins changed: rebuild" in lines["math"]
    assert "not built" in lines["ocr"] and "managed-scorers envs build ocr" in lines["ocr"]
    assert main(["envs", "path", "image", "--root", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "image" / ".venv" / "bin" / "python")
    assert main(["envs", "path", "ocr", "--root", str(tmp_path)]) == 2
    assert "run `managed-scorers envs build ocr`" in capsys.readouterr().err


def test_unknown_names_and_bad_flag_combinations_fail_in_words(tmp_path, capsys):
    assert main(["envs", "build", "nosuch", "--root", str(tmp_path)]) == 2
    assert "no scorer env spec named 'nosuch'" in capsys.readouterr().err
    assert main(["envs", "build", "math", "image", "--dir", str(tmp_path / "x")]) == 2
    assert "--dir names the folder of one env" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing was built
    precious = tmp_path / "home"
    (precious / "notes").mkdir(parents=True)
    spec = tmp_path / "spec.txt"
    spec.write_text("\n")
    assert main(["envs", "build", "x", "--requirements", str(spec), "--dir", str(precious)]) == 2
    assert "was not made by managed-scorers envs build" in capsys.readouterr().err and (precious / "notes").is_dir()
    (precious / "pyvenv.cfg").write_text("home = /usr/bin\n")  # someone else's venv is not ours to wipe either
    assert main(["envs", "build", "x", "--requirements", str(spec), "--dir", str(precious)]) == 2
    assert (precious / "notes").is_dir()
    assert main(["envs", "build", "x", "--requirements", str(spec), "--dir", sys.prefix]) == 2
    assert "the environment running this command" in capsys.readouterr().err
    built = fake_env(tmp_path, "image", env_builder.spec_hash(scorer_envs.spec_path("image")))
    bad_python = ["envs", "build", "image", "--root", str(tmp_path), "--force", "--python", "/nonexistent/python3"]
    assert main(bad_python) == 2
    assert (
        "is not an executable: nothing was changed" in capsys.readouterr().err and (built / "bin" / "python").exists()
    )


@pytest.mark.slow
def test_a_failed_install_fails_the_build_and_writes_no_stamp(tmp_path):
    spec = tmp_path / "broken.txt"
    spec.write_text("managed-scorers-no-such-package==0.0.1\n")
    venv = tmp_path / "broken" / ".venv"
    done = subprocess.run(
        [*CLI, "envs", "build", "broken", "--requirements", str(spec), "--dir", str(venv)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "pip install failed" in done.stderr and "managed-scorers-no-such-package" in done.stderr
    assert not (venv / scorer_envs.STAMP).exists()


@pytest.mark.slow
def test_a_build_is_skipped_when_the_pins_did_not_change_and_redone_when_they_did(tmp_path):
    spec = tmp_path / "tiny.txt"
    spec.write_text("# nothing to install: a bare venv\n")
    venv = tmp_path / "tiny" / ".venv"
    messages: list[str] = []
    assert env_builder.build(spec, venv, say=messages.append) is True
    assert (venv / scorer_envs.STAMP).read_text().strip() == env_builder.spec_hash(spec)
    assert env_builder.build(spec, venv, say=messages.append) is False and messages[-1].endswith("up to date")
    marker = venv / "marker"
    marker.write_text("from the first build")
    spec.write_text("# nothing to install\n--no-index\n")  # the pins changed: rebuilt from scratch
    assert env_builder.build(spec, venv, say=messages.append) is True and not marker.exists()
    assert os.access(venv / "bin" / "python", os.X_OK)
