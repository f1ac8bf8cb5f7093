"""A dataset row's cells as `managed-scorers score` reads them: a column by name, or by a dotted
path into nested records (`reward_model.ground_truth`, as verl stores its gold); and the text of a
prompt or a completion that a framework stores as chat messages (TRL's conversational format, verl's
prompts) or as a one-element list of responses (verl's generation output with one sample per
prompt).

The text scored is the last assistant message's content; the prompt is the last message's content
(the user's turn), as the TRL adapter passes them. Scorers take text, not conversations: to score a
whole conversation, render it to one string column first (e.g. with the tokenizer's chat template).
"""

from __future__ import annotations

from typing import Any


class NoText(ValueError):
    """A cell holds no text a scorer can take (the message says what it holds instead)."""


def cell(fields: dict[str, Any], column: str) -> Any:
    """The cell `column` names: a top-level key first (a name with a dot in it), else a dotted path
    through nested records; None where it is missing."""
    if column in fields:
        return fields[column]
    value: Any = fields
    for part in column.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def text_of(value: Any, completion: bool) -> Any:
    """A string as it is; chat messages as the text scored (a completion: the last assistant
    message's content; a prompt: the last message's); a one-element list of strings as that string.
    Anything else is returned unchanged, for the item's own checks (None: no such column)."""
    if not isinstance(value, list):
        return value
    if value and all(isinstance(entry, str) for entry in value):
        if len(value) > 1:
            raise NoText(
                f"holds {len(value)} responses (verl's generation with n_samples > 1): one "
                f"response per row is "
                "scored; give each its own row first (pandas: DataFrame.explode)"
            )
        return value[0]
    if not value or not all(isinstance(entry, dict) for entry in value):
        raise NoText("holds a list that is neither chat messages nor one response")
    if completion:
        messages = [m for m in value if m.get("role") == "assistant"]
        if not messages:
            raise NoText("holds chat messages with no assistant message")
    else:
        messages = value
    return _content(messages[-1])


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal parts: the text ones
        return "".join(part.get("text") or "" for part in content if isinstance(part, dict))
    calls = " (a tool call)" if message.get("tool_calls") else ""
    raise NoText(
        f"its last {message.get('role')} message's content is "
        f"{type(content).__name__}{calls}, not text"
    )
