"""The example recipes that ship with the package (`managed-scorers recipes [NAME]`)."""

from __future__ import annotations

import re
from pathlib import Path

from supervisor.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parent / "example_recipes"


def example_recipes() -> dict[str, Path]:
    """The recipes that ship with the package, by name (`managed-scorers recipes NAME` prints one):
    a verl-omni recipe and a UniRL `_target_` tree, each naming its scorer envs, so they run
    installed."""
    return {path.stem: path for path in sorted(EXAMPLES.glob("*.yaml"))}


def example_recipe(name: str) -> Path:
    recipes = example_recipes()
    if name not in recipes:
        raise ConfigError(f"no example recipe named {name!r} (there are: {', '.join(recipes)})")
    return recipes[name]


def description(path: Path) -> str:
    """A recipe's first sentence, from the comment block it opens with, on one line (never cut)."""
    comments = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        comments.append(line.lstrip("#").strip())
    return re.split(r"(?<=\.)\s", " ".join(comments), maxsplit=1)[0]
