"""`managed-scorers`: build and list scorer envs (and, as they land, score datasets, serve, doctor).

Each subcommand is a thin layer over the library call that does the job; errors the user can
fix (a missing env, a failed pip) print one line naming the fix and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from supervisor import scorer_envs
from supervisor.errors import ConfigError


def _envs_build(args: argparse.Namespace) -> int:
    if args.requirements is not None:  # a custom env (the repo's trainer env, say): explicit spec and folder
        if args.dir is None or len(args.names) != 1:
            raise ConfigError("--requirements builds one env: give one NAME and --dir")
        scorer_envs.build(args.requirements, args.dir, args.python, args.force)
        return 0
    if args.dir is not None and len(args.names) != 1:
        raise ConfigError("--dir names the folder of one env: give one NAME")
    names = args.names or scorer_envs.spec_names()
    for name in names:
        spec = scorer_envs.spec_path(name)  # unknown names fail before anything is built
        venv = args.dir if args.dir is not None else scorer_envs.env_dir(name, args.root)
        scorer_envs.build(spec, venv, args.python, args.force)
    return 0


def _envs_list(args: argparse.Namespace) -> int:
    print(f"scorer envs under {args.root or scorer_envs.envs_root()}")
    for name in scorer_envs.spec_names():
        status = scorer_envs.status(name, args.root)
        state = "pins changed: rebuild" if status.pins_changed else "built" if status.built else "not built"
        packages = "  ".join(f"{k}=={v or '?'}" for k, v in status.packages.items())
        python = status.venv / "bin" / "python" if status.built else f"(managed-scorers envs build {name})"
        print(f"  {name:<6} {state:<22} {python}  {packages}".rstrip())
    return 0


def _envs_path(args: argparse.Namespace) -> int:
    print(scorer_envs.env_python(args.name, args.root))
    return 0


def _folder(value: str) -> Path:
    return Path(value).expanduser().absolute()


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="managed-scorers", description=__doc__.splitlines()[0])
    commands = top.add_subparsers(dest="command", required=True)

    envs = commands.add_parser("envs", help="scorer envs: build, list, path").add_subparsers(
        dest="envs_command", required=True
    )
    root_help = f"where envs live (default ${scorer_envs.ROOT_VARIABLE}, else ~/.local/share/managed-scorers/envs)"
    build = envs.add_parser("build", help="build scorer envs (all when no NAME), only if their pins changed")
    build.add_argument("names", nargs="*", metavar="NAME", help=f"one of {', '.join(scorer_envs.spec_names())}")
    build.add_argument("--root", type=_folder, help=root_help)
    build.add_argument("--dir", type=_folder, help="the venv folder of this one env (instead of ROOT/NAME/.venv)")
    build.add_argument("--requirements", type=_folder, help="build from this requirements file instead of a spec")
    build.add_argument("--python", help="the interpreter that makes the venv (default: this one's base)")
    build.add_argument("--force", action="store_true", help="rebuild even when the pins did not change")
    build.set_defaults(run=_envs_build)
    listing = envs.add_parser("list", help="each env: built or not, its python, key package versions")
    listing.add_argument("--root", type=_folder, help=root_help)
    listing.set_defaults(run=_envs_list)
    path = envs.add_parser("path", help="the python of a built env")
    path.add_argument("name", metavar="NAME")
    path.add_argument("--root", type=_folder, help=root_help)
    path.set_defaults(run=_envs_path)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.run(args))
    except ConfigError as exc:
        print(f"managed-scorers {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
