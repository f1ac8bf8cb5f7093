"""uv as an env builder's installer (`envs build --installer uv`), under pip's configuration.

uv reads neither pip.conf nor PIP_* variables (uv's docs, "Compatibility with pip"). The index, the
find-links folders and the constraints that make a build here take the CPU torch are pip settings,
so the builder asks the new venv's pip for its effective settings (`pip config list`: files and
PIP_* variables) and passes each one uv has an equivalent for as a flag or variable of uv's own. A
setting with no equivalent here refuses the build, naming it, rather than being dropped. uv resolves
with `--index-strategy unsafe-best-match`: pip's rule (the best version across every index), so both
installers pick the same versions from the same indexes.
"""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

from supervisor.scorer_envs import EnvError

# pip setting -> uv flag, one per value (whitespace-separated in pip's config)
LIST_FLAGS = {
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
    "trusted-host": "--allow-insecure-host",
}
VALUE_FLAGS = {
    "index-url": "--index-url",
    "only-binary": "--only-binary",
    "no-binary": "--no-binary",
}
SWITCHES = {
    "no-index": ["--no-index"],
    "pre": ["--prerelease", "allow"],
    "no-cache-dir": ["--no-cache"],
}
VARIABLES = {
    "cert": ["SSL_CERT_FILE"],
    "timeout": ["UV_HTTP_TIMEOUT"],
    "proxy": ["HTTPS_PROXY", "HTTP_PROXY"],
}
# pip's own behaviour (its output, its cache, its checks): nothing a uv install needs
PIP_ONLY = {
    "disable-pip-version-check",
    "no-input",
    "progress-bar",
    "no-color",
    "quiet",
    "verbose",
    "log",
    "root-user-action",
    "no-warn-script-location",
    "require-virtualenv",
    "cache-dir",
    "retries",
    "break-system-packages",
    "no-python-version-warning",
    "use-feature",
}
# pip's precedence: [install] over [global], PIP_* over both
SECTIONS = {"global": 0, "install": 1, ":env:": 2}
TRUE = {"1", "true", "yes", "on"}


def find_uv() -> str:
    """uv beside this python (`pip install uv` into this env), else on PATH; EnvError naming the
    fix."""
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.is_file() else shutil.which("uv")
    if found is None:
        raise EnvError(
            "--installer uv: uv is not installed (not beside this python, not on PATH): `pip "
            "install uv`, or build with pip (the default; `make ENV_INSTALLER=pip`)"
        )
    return found


def pip_settings(listing: str) -> dict[str, str]:
    """`pip config list`'s output as the settings a `pip install` applies, by name
    (`index-url`...)."""
    chosen: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        key, sep, text = line.partition("=")
        section, _, name = key.rpartition(".")
        if not sep or section not in SECTIONS:
            continue
        try:
            # pip prints each value as a Python string literal
            value = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError) as exc:
            raise EnvError(
                f"--installer uv: cannot read pip's setting {key} from `pip config list`: {text!r}"
            ) from exc
        name = "timeout" if name == "default-timeout" else name.replace("_", "-")
        if name not in chosen or SECTIONS[section] >= chosen[name][0]:
            chosen[name] = (SECTIONS[section], str(value))
    return {name: value for name, (_, value) in chosen.items()}


def uv_arguments(settings: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The uv flags and variables that carry pip's `settings`; EnvError for one uv has no equivalent
    of."""
    flags = ["--index-strategy", "unsafe-best-match"]
    variables: dict[str, str] = {}
    for name, value in sorted(settings.items()):
        if name in LIST_FLAGS:
            flags += [part for item in value.split() for part in (LIST_FLAGS[name], item)]
        elif name in VALUE_FLAGS:
            flags += [VALUE_FLAGS[name], value]
        elif name in SWITCHES:
            flags += SWITCHES[name] if value.strip().lower() in TRUE else []
        elif name in VARIABLES:
            variables.update(dict.fromkeys(VARIABLES[name], value))
        elif name not in PIP_ONLY:
            raise EnvError(
                f"--installer uv: pip's setting {name}={value!r} has no uv equivalent this "
                f"builder carries: "
                "build with pip (the default; `make ENV_INSTALLER=pip`), or unset it"
            )
    return flags, variables
