"""Download the GPU check's carried packages (bench/gpu_wheels.txt) as wheels for another machine.

    python -m bench.gpu_wheels DEST [--python-version 3.12] [--platform manylinux_2_28_x86_64 ...]

Why: the GPU machines reach no package index. Their python has torch with CUDA and most of what
the check needs; the rest travels as wheels, fetched here for that machine's Python and platform
(pip's `--python-version`/`--platform`: no build, no dependencies resolved, exactly the pins).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

LIST = Path(__file__).with_name("gpu_wheels.txt")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def pins() -> list[str]:
    lines = (line.split("#")[0].strip() for line in LIST.read_text().splitlines())
    return [line for line in lines if line]


def download(dest: Path, python_version: str, platforms: tuple[str, ...] = PLATFORMS) -> list[Path]:
    """The wheels of every pin, for that Python and platform, in `dest`; CalledProcessError if pip
    cannot."""
    dest.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
    ]
    command += ["--python-version", python_version, "--implementation", "cp", "--dest", str(dest)]
    for platform in platforms:
        command += ["--platform", platform]
    subprocess.run([*command, *pins()], check=True, timeout=600)
    return sorted(dest.glob("*.whl"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument(
        "--python-version", default="3.12", help="the GPU machine's Python (default 3.12)"
    )
    parser.add_argument(
        "--platform", action="append", help="pip --platform tags (default: manylinux x86_64)"
    )
    args = parser.parse_args()
    wheels = download(args.dest, args.python_version, tuple(args.platform or PLATFORMS))
    for wheel in wheels:
        print(f"{wheel.stat().st_size / 1024:8.0f} KiB  {wheel.name}")
    print(f"{len(wheels)} wheels in {args.dest}: carry them, then on the GPU machine:")
    print(f"  python3 -m pip install -q --no-index --no-deps --target /tmp/site {args.dest}/*.whl")
    print("  PYTHONPATH=/tmp/site python3 -m bench.gpu_residency --python python3 --site /tmp/site")
    return 0


if __name__ == "__main__":
    sys.exit(main())
