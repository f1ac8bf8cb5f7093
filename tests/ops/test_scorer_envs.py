"""Scorer envs by name: the shipped specs, `managed-scorers envs build/list/path`, stamps that never
lie."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor import scorer_envs
from supervisor.ops import build_step, env_builder
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
    # engine: the verl-omni engine models' default env (transformers serve), no built-in's
    shipped = {"code", "embed", "engine", "image", "math", "ocr"}
    assert declared <= set(scorer_envs.spec_names()) == shipped
    assert "antlr4-python3-runtime==4.13.2" in env_builder.requirement_lines(
        scorer_envs.spec_path("math")
    )
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
    assert env_builder.no_deps_lines(trainer_spec) == [
        "verl==0.9.1",
        "openrlhf==0.11.2",
        "unirl==0.2.0",
    ]
    assert not any(
        line.startswith(("verl", "openrlhf", "unirl"))
        for line in env_builder.requirement_lines(trainer_spec)
    )


def test_pip_check_is_excused_only_for_the_packages_installed_without_dependencies(tmp_path):
    complain = (
        "import sys; print('verl 0.9.1 requires peft, which is not installed.'); "
        "print(sys.argv[1]); sys.exit(1)"
    )
    fake_pip = [sys.executable, "-c", complain]
    env_builder._check([*fake_pip, "unirl 0.2.0 requires diffusers"], tmp_path, {"verl", "unirl"})
    with pytest.raises(EnvError, match="trl 1.16.0 requires"):
        env_builder._check(
            [*fake_pip, "trl 1.16.0 requires accelerate"], tmp_path, {"verl", "unirl"}
        )


def test_envs_list_tells_built_not_built_and_changed_pins(tmp_path, capsys):
    fake_env(tmp_path, "image", env_builder.spec_hash(scorer_envs.spec_path("image")))
    fake_env(tmp_path, "math", "0" * 64)  # built from other pins
    assert main(["envs", "list", "--root", str(tmp_path)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert (
        "built" in lines["image"]
        and "pillow==13.0.0" in lines["image"]
        and "numpy==?" in lines["image"]
    )
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
    assert (
        "was not made by managed-scorers envs build" in capsys.readouterr().err
        and (precious / "notes").is_dir()
    )
    # someone else's venv is not ours to wipe either
    (precious / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert main(["envs", "build", "x", "--requirements", str(spec), "--dir", str(precious)]) == 2
    assert (precious / "notes").is_dir()
    assert main(["envs", "build", "x", "--requirements", str(spec), "--dir", sys.prefix]) == 2
    assert "the environment running this command" in capsys.readouterr().err
    built = fake_env(tmp_path, "image", env_builder.spec_hash(scorer_envs.spec_path("image")))
    bad_python = [
        "envs",
        "build",
        "image",
        "--root",
        str(tmp_path),
        "--force",
        "--python",
        "/nonexistent/python3",
    ]
    assert main(bad_python) == 2
    assert (
        "is not an executable: nothing was changed" in capsys.readouterr().err
        and (built / "bin" / "python").exists()
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


def other_interpreter() -> str | None:
    """A python of another version than this one's, if this machine has one (pyenv's, or on
    PATH)."""
    mine = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidates = sorted(Path.home().glob(".pyenv/versions/3.1[0-9]*/bin/python3.1[0-9]"))
    candidates += [
        Path(found) for v in ("3.12", "3.13", "3.10") if (found := shutil.which(f"python{v}"))
    ]
    for candidate in candidates:
        version = subprocess.run(
            [str(candidate), "-c", "import sys; print(sys.version)"], capture_output=True, text=True
        )
        if (
            version.returncode == 0
            and not version.stdout.startswith(mine)
            and version.stdout >= "3.10"
        ):
            return str(candidate)
    return None


@pytest.mark.slow
def test_a_build_says_its_phases_and_is_redone_when_its_pins_or_its_interpreter_change_and_then_removed(  # noqa: E501
    tmp_path,
):
    """A bare venv (nothing to download), built three times: first, for new pins, for another
    interpreter (a second python here, else the stamp's recorded one rewritten); skipped in between;
    then removed."""
    spec = tmp_path / "tiny.txt"
    spec.write_text("# nothing to install: a bare venv\n")
    venv = tmp_path / "tiny" / ".venv"
    said: list[str] = []
    assert env_builder.build(spec, venv, say=said.append) is True
    assert said[0].endswith(": not built") and said[1].startswith("  creating the venv with ")
    assert said[-2] == "  checking the installed packages (pip check)" and " built in " in said[-1]
    digest, python = env_builder.read_stamp(venv)
    assert digest == env_builder.spec_hash(spec) and python is not None
    assert python.version == sys.version.split()[0] and python.path == os.path.realpath(
        sys._base_executable
    )
    assert (
        env_builder.build(spec, venv, say=said.append) is False
        and "up to date, built with Python" in said[-1]
    )
    marker = venv / "marker"
    marker.write_text("from the first build")
    spec.write_text("# nothing to install\n--no-index\n")  # the pins changed: rebuilt from scratch
    said.clear()
    assert env_builder.build(spec, venv, say=said.append) is True and not marker.exists()
    assert (
        said[0].endswith(": its pins changed")
        and "  installing 1 requirement line(s) with pip" in said
    )
    other = other_interpreter()
    if other is None:  # no second python here: the stamp says another one built it
        stamp = venv / scorer_envs.STAMP
        stamp.write_text(stamp.read_text().replace(f"python {python.version} ", "python 3.99.0 "))
    said.clear()
    assert (
        env_builder.build(spec, venv, python=other or sys._base_executable, say=said.append) is True
    )
    assert f"it was built with Python {'3.99.0' if other is None else python.version}" in said[0]
    rebuilt = env_builder.read_stamp(venv)[1]
    assert rebuilt is not None and rebuilt.path == os.path.realpath(other or sys._base_executable)
    # no --python: the one it was built with
    assert env_builder.build(spec, venv, say=said.append) is False
    assert main(["envs", "remove", "tiny", "--root", str(tmp_path)]) == 0
    assert not venv.exists() and spec.is_file()


def test_envs_build_with_no_name_refuses_listing_the_envs_and_all_builds_every_one(
    tmp_path, capsys, monkeypatch
):
    assert main(["envs", "build", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "name the env(s) to build: code, embed, engine, image, math, ocr; or --all" in err
    )
    assert main(["envs", "build", "math", "--all", "--root", str(tmp_path)]) == 2
    assert "--all builds every env: give no NAME" in capsys.readouterr().err
    built: list[Path] = []
    monkeypatch.setattr(
        env_builder, "build", lambda spec, venv, *args, **options: built.append(venv)
    )
    assert main(["envs", "build", "--all", "--root", str(tmp_path)]) == 0
    assert built == [
        scorer_envs.env_dir(name, tmp_path)
        for name in ("code", "embed", "engine", "image", "math", "ocr")
    ]


def test_envs_remove_removes_only_an_env_this_builder_made_under_the_root(tmp_path, capsys):
    root = tmp_path / "root"
    image = fake_env(root, "image", "0" * 64)
    # built with --dir into the root: removable by its name
    custom = fake_env(root, "mine", "0" * 64)
    assert main(["envs", "remove", "nosuch", "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "no env named 'nosuch'" in err
        and "embed, engine, image, math, mine, ocr" in err
    )
    assert main(["envs", "remove", "..", "--root", str(root)]) == 2
    assert main(["envs", "remove", "math", "--root", str(root)]) == 0
    assert "not built, nothing to remove" in capsys.readouterr().err
    assert main(["envs", "remove", "image", "--root", str(root)]) == 0 and not image.exists()
    assert main(["envs", "remove", "mine", "--root", str(root)]) == 0 and not custom.exists()
    # an env elsewhere, linked into the root
    outside = fake_env(tmp_path / "outside", "ocr", "0" * 64)
    (root / "ocr").mkdir()
    (root / "ocr" / ".venv").symlink_to(outside)
    (root / "embed").symlink_to(outside.parent)
    for name in ("ocr", "embed"):
        assert main(["envs", "remove", name, "--root", str(root)]) == 2
        assert "is a symbolic link: not removed" in capsys.readouterr().err
    assert (outside / "bin" / "python").is_symlink() and (outside / scorer_envs.STAMP).is_file()
    foreign = root / "math" / ".venv"  # not made by the builder: refused
    (foreign / "bin").mkdir(parents=True)
    assert main(["envs", "remove", "math", "--root", str(root)]) == 2 and (foreign / "bin").is_dir()
    assert "was not made by managed-scorers envs build" in capsys.readouterr().err


def test_an_old_stamp_takes_its_interpreter_from_pyvenv_cfg_and_list_shows_it(tmp_path, capsys):
    venv = fake_env(tmp_path, "image", "a" * 64)
    (venv / "pyvenv.cfg").write_text(
        "home = /usr/bin\nversion = 3.11.7\nexecutable = /usr/bin/python3.11\n"
    )
    digest, python = env_builder.read_stamp(venv)
    assert digest == "a" * 64 and python == env_builder.Interpreter(
        "3.11.7", os.path.realpath("/usr/bin/python3.11")
    )
    assert main(["envs", "list", "--root", str(tmp_path)]) == 0
    assert "  Python 3.11.7  pillow==13.0.0" in capsys.readouterr().out
    (venv / scorer_envs.STAMP).write_text("b" * 64 + "\npython 3.12.1 /opt/python3.12\n")
    assert env_builder.read_stamp(venv) == (
        "b" * 64,
        env_builder.Interpreter("3.12.1", "/opt/python3.12"),
    )


def test_a_step_that_runs_long_says_so_with_its_last_line_or_passes_its_output_on(tmp_path):
    child = [
        sys.executable,
        "-c",
        "import time; print('Collecting torch==2.13.0', flush=True); time.sleep(0.8)",
    ]
    said: list[str] = []
    build_step.run_step(child, tmp_path, "pip install", said.append, heartbeat_s=0.2)
    assert said and all(line.startswith("  pip install: still running after ") for line in said)
    assert said[-1].endswith(": Collecting torch==2.13.0")
    said.clear()
    output = build_step.run_step(
        child, tmp_path, "pip install", said.append, verbosity=1, heartbeat_s=0.2
    )
    assert said == ["Collecting torch==2.13.0"] and output == "Collecting torch==2.13.0"
    failing = [
        sys.executable,
        "-c",
        "print('ERROR: no matching distribution'); raise SystemExit(1)",
    ]
    with pytest.raises(
        EnvError, match=r"pip install failed \(exit 1\): ERROR: no matching distribution"
    ):
        build_step.run_step(failing, tmp_path, "pip install", said.append)


def test_without_python_an_env_keeps_its_interpreter_while_it_runs_else_takes_this_ones_base(
    tmp_path,
):
    base = env_builder.interpreter(sys._base_executable)
    assert env_builder._default_interpreter(base) == base
    broken = tmp_path / "python3.11"
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(0o755)
    assert env_builder._default_interpreter(env_builder.Interpreter("3.11.7", str(broken))) == base
    # upgraded in place
    assert env_builder._default_interpreter(env_builder.Interpreter("3.99.0", base.path)) == base
