"""`envs build --installer uv`: pip's settings carried to uv, a real uv build from a find-links
folder under a pip constraint, and the refusals (no uv, a pip setting uv has no equivalent of), each
one line, exit 2."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from supervisor.ops import env_builder
from supervisor.ops.build_step import clean_environment
from supervisor.ops.cli import main
from supervisor.ops.uv_installer import pip_settings, uv_arguments
from supervisor.scorer_envs import EnvError

LISTING = """\
:env:.constraint='/tmp/mine.txt'
:env:.default-timeout='180'
:env:.disable-pip-version-check='1'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
install.no-index='false'
global.no-index='true'
global.cert='/etc/ssl/certs/ca-certificates.crt'
"""


def test_pips_settings_become_uv_flags_and_variables_by_pips_precedence():
    settings = pip_settings(LISTING)
    assert settings["constraint"] == "/tmp/mine.txt"  # PIP_CONSTRAINT over the config file's
    # [install] over [global]
    assert settings["no-index"] == "false" and settings["timeout"] == "180"
    flags, variables = uv_arguments(settings)
    assert flags == [
        "--index-strategy",
        "unsafe-best-match",
        "--constraint",
        "/tmp/mine.txt",
        "--extra-index-url",
        "file:///opt/pypi/simple",
        "--extra-index-url",
        "file:///opt/pypi-more/simple",
        "--find-links",
        "/opt/wheels",
    ]
    assert variables == {
        "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
        "UV_HTTP_TIMEOUT": "180",
    }
    with pytest.raises(EnvError, match=r"pip's setting user='true' has no uv equivalent"):
        uv_arguments({"user": "true"})


def test_installer_uv_without_uv_refuses_in_one_line_before_anything_changes(
    tmp_path, capsys, monkeypatch
):
    # no uv on PATH; none beside the python either (the dev env has one: `make test` builds with it)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    spec = tmp_path / "spec.txt"
    spec.write_text("\n")
    args = [
        "envs",
        "build",
        "x",
        "--requirements",
        str(spec),
        "--dir",
        str(tmp_path / "x"),
        "--installer",
        "uv",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "--installer uv: uv is not installed" in err
        and "`pip install uv`" in err
    )
    assert not (tmp_path / "x").exists()


def tiny_wheel(folder: Path, version: str) -> Path:
    """A pure-python wheel of `ms_tiny`, written by hand: an index nobody else has."""
    dist = f"ms_tiny-{version}.dist-info"
    files = {
        "ms_tiny.py": f"VERSION = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: ms_tiny\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: "
        "py3-none-any\n",
    }

    def digest(text: str) -> str:
        return (
            "sha256="
            + base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        )

    record = "".join(
        f"{path},{digest(text)},{len(text.encode())}\n" for path, text in files.items()
    )
    path = folder / f"ms_tiny-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in {**files, f"{dist}/RECORD": record + f"{dist}/RECORD,,\n"}.items():
            archive.writestr(name, text)
    return path


@pytest.fixture(scope="module")
def uv_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of a uv binary: the dev env's (requirements-dev.txt), else uv installed by pip
    into a scratch folder; skipped where it cannot be."""
    if (Path(sys.executable).parent / "uv").is_file():
        return Path(sys.executable).parent
    target = tmp_path_factory.mktemp("uv")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-input", "--target", str(target), "uv"],
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0 or not (target / "bin" / "uv").is_file():
        pytest.skip(
            f"uv does not install here (`pip install uv`, exit {done.returncode}): "
            f"{done.stderr[-300:]}"
        )
    return target / "bin"


@pytest.mark.slow
def test_a_uv_build_takes_pips_find_links_and_constraint_and_says_its_phases(tmp_path, uv_folder):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for version in ("1.0", "2.0"):
        tiny_wheel(wheels, version)
    (tmp_path / "cap.txt").write_text("ms_tiny<2\n")
    spec = tmp_path / "spec.txt"
    spec.write_text("ms_tiny\n")
    venv = tmp_path / "tiny" / ".venv"
    env = {
        **clean_environment(),
        "PATH": f"{uv_folder}{os.pathsep}{os.environ['PATH']}",
        "PIP_NO_INDEX": "1",  # only the find-links folder: uv would find ms_tiny nowhere else
        "PIP_FIND_LINKS": str(wheels),
        "PIP_CONSTRAINT": str(tmp_path / "cap.txt"),
    }
    command = [
        sys.executable,
        "-m",
        "supervisor",
        "envs",
        "build",
        "tiny",
        "--requirements",
        str(spec),
    ]
    command += ["--dir", str(venv), "--installer", "uv"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert (
        "  installing 1 requirement line(s) with uv" in done.stderr and " built in " in done.stderr
    )
    # the pip constraint held
    assert env_builder.installed_versions(venv, ["ms_tiny"]) == {"ms_tiny": "1.0"}
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "up to date" in again.stderr, again.stderr
