"""Where in a recipe file a problem lives: the line an editor jumps to, read from the YAML's own
node marks, so that every recipe error names `file:line` whatever style the recipe is written in.

Two ways in: a path of keys and indexes (pydantic's `loc`, or the dotted path a recipe parser's
message starts with), and a term's place (`reward.correct`), found by its name in the file. A path
segment that is no key of the file (a union's tag such as `local` or `float`) is stepped over; a
path that reaches nothing gives no line, never a wrong one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import yaml

# the dotted path a recipe parser's message starts with: `reward.models.judge: ...`, `terms.0.weight
# ...`
_LEADING_PATH = re.compile(r"[A-Za-z_][\w-]*(?:\.[\w-]+)*(?=[: ])")


def _root(text: str) -> yaml.Node | None:
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:  # the loader has said what is wrong with the file already
        return None


def _step(node: yaml.Node, part: str | int) -> tuple[yaml.Node, int] | None:
    """The child named `part` and the line it starts on (its key's, for a mapping), or None."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                return value, key.start_mark.line + 1
    if isinstance(node, yaml.SequenceNode) and str(part).isdigit() and int(part) < len(node.value):
        item = node.value[int(part)]
        return item, item.start_mark.line + 1
    return None


def line_of(text: str, path: Sequence[str | int]) -> int | None:
    """The line of the deepest node `path` reaches in the YAML `text` (1-based), or None."""
    node = _root(text)
    line = None
    for part in path:
        found = None if node is None else _step(node, part)
        if found is not None:
            node, line = found
    return line


def line_of_message(text: str, message: str) -> int | None:
    """The line of the dotted path a message starts with, when that path's first key is in the
    file."""
    match = _LEADING_PATH.match(message)
    if match is None:
        return None
    path = match.group(0).split(".")
    node = _root(text)
    if node is None or _step(node, path[0]) is None:
        return None
    return line_of(text, path)


def _named(node: yaml.Node, name: str) -> int | None:
    """The first line, depth first, where a term called `name` is declared: a mapping with `name:
    NAME` (a `terms:` or FF `rewards:` list) or a key NAME (verl-omni's `reward_functions`)."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode):
                continue
            if key.value == "name" and isinstance(value, yaml.ScalarNode) and value.value == name:
                return node.start_mark.line + 1
            if key.value == name and isinstance(value, yaml.MappingNode):
                return key.start_mark.line + 1
        children = [value for _, value in node.value]
    elif isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    else:
        return None
    for child in children:
        line = _named(child, name)
        if line is not None:
            return line
    return None


def line_of_term(text: str, place: str) -> int | None:
    """The line of the term at `place` (`reward.NAME` or `validation.NAME`, as preflight names
    them); a validation term is looked for under the file's `validation:` first."""
    panel, _, name = place.partition(".")
    root = _root(text)
    if root is None or not name:
        return None
    under = _step(root, "validation") if panel == "validation" else None
    return _named(under[0] if under else root, name)
