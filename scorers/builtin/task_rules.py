"""Task rule rewards: GSM8K final answers, countdown equations, arithmetic results, a format regex.

Each is a per-candidate function lifted to the group contract by `map_candidates`. A
malformed answer scores 0 (or the configured `format_score`) and is counted in the
term's diagnostics, so a policy that stops answering shows up in the metrics. A missing
or malformed reference is the dataset's fault: a 4xx naming the item, never a 0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from scorers.base import ScoreInputError, ScoreItem, reference_answer
from scorers.builtin.arithmetic import (
    DivisionByZero,
    ExpressionError,
    as_fraction,
    evaluate,
    numbers_in,
)
from scorers.groups import GroupContext
from scorers.pointwise import Verdict, map_candidates

_HASH = "####"
_BOXED = re.compile(r"\\boxed\s*\{")


def _finite_score(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")


def _choice(name: str, value: Any, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


# -- GSM8K ------------------------------------------------------------------------------------
EXTRACTIONS = ("hash_or_last", "hash", "last")


def gsm8k_answer(text: str, extraction: str) -> Fraction | None:
    """The final answer: the first number after the last `####`, or the last number in the text.

    Normalisation: thousands commas and a currency sign are dropped, `42.0` equals `42`,
    and whatever follows the number (units, a full stop, `%`) is ignored.
    """
    if extraction != "last" and _HASH in text:
        found = numbers_in(text.rsplit(_HASH, 1)[1])
        return found[0] if found else None
    if extraction == "hash":
        return None
    found = numbers_in(text)
    return found[-1] if found else None


def _gsm8k_gold(item: ScoreItem, reference: Any) -> Fraction:
    gold = reference_answer(reference)
    value = None if gold is None else gsm8k_answer(gold, "hash_or_last")
    if value is None:
        raise ScoreInputError(
            f"item {item.id!r}: gsm8k needs a reference with a number (got {reference!r})"
        )
    return value


def _check_gsm8k(extraction: str = "hash_or_last", format_score: float = 0.0) -> None:
    _choice("gsm8k: extraction", extraction, EXTRACTIONS)
    _finite_score("gsm8k: format_score", format_score)


def gsm8k(
    candidate: ScoreItem,
    context: GroupContext,
    extraction: str = "hash_or_last",
    format_score: float = 0.0,
) -> Verdict:
    """1.0 when the final answer equals the reference's; `format_score` when an answer was found but
    differs; 0.0 (counted as no_answer) when none was found. `extraction`: "hash_or_last" (after
    `####` if present, else the last number), "hash" (only after `####`) or "last"."""
    gold = _gsm8k_gold(candidate, context.reference)
    answer = gsm8k_answer(candidate.required_text(), extraction)
    if answer is None:
        return Verdict(0.0, {"no_answer": 1})
    return Verdict(1.0) if answer == gold else Verdict(float(format_score), {"wrong_answer": 1})


Gsm8k = map_candidates(
    gsm8k,
    name="gsm8k",
    required_fields=("text", "reference"),
    diagnostics=("no_answer", "wrong_answer"),
    check_params=_check_gsm8k,
)


# -- countdown --------------------------------------------------------------------------------


def tagged(text: str, tag: str | None) -> str | None:
    """The content of the last `<tag>...</tag>`, or the whole text when `tag` is None.

    Found from the end with `rfind`, in linear time: a lazy regex rescans the rest of the text
    from every unclosed `<tag>` (minutes on a few hundred KB of them)."""
    if tag is None:
        return text
    end = text.rfind(f"</{tag}>")
    start = text.rfind(f"<{tag}>", 0, end) if end >= 0 else -1
    return text[start + len(tag) + 2 : end] if start >= 0 else None


def _countdown_task(item: ScoreItem, reference: Any) -> tuple[Fraction, list[Fraction]]:
    if isinstance(reference, Mapping):
        target = as_fraction(reference.get("target"))
        given = reference.get("numbers", reference.get("nums"))
        numbers = [as_fraction(n) for n in given] if isinstance(given, (list, tuple)) else []
        if target is not None and numbers and None not in numbers:
            return target, sorted(n for n in numbers if n is not None)
    raise ScoreInputError(
        f"item {item.id!r}: countdown needs a reference like {{'target': 24, 'numbers': [4, "
        f"6, 1, 1]}} (or 'nums'), got {reference!r}"
    )


def _check_countdown(
    answer_tag: str | None = "answer", format_score: float = 0.0, use_all_numbers: bool = True
) -> None:
    if answer_tag is not None and not (
        isinstance(answer_tag, str) and re.fullmatch(r"[A-Za-z_][\w-]*", answer_tag)
    ):
        raise ValueError(f"countdown: answer_tag must be a tag name or None, got {answer_tag!r}")
    _finite_score("countdown: format_score", format_score)
    if not isinstance(use_all_numbers, bool):
        raise ValueError(f"countdown: use_all_numbers must be a bool, got {use_all_numbers!r}")


def countdown(
    candidate: ScoreItem,
    context: GroupContext,
    answer_tag: str | None = "answer",
    format_score: float = 0.0,
    use_all_numbers: bool = True,
) -> Verdict:
    """1.0 when the equation in the last `<answer>` tag uses each given number exactly once (every
    one of them, unless `use_all_numbers` is False) with + - * / and parentheses and equals the
    target.

    Text after an `=` is ignored (`(6-1)*4 = 20`). A well-formed equation with the wrong numbers or
    value scores `format_score`; division by zero or a malformed expression scores 0. Each outcome
    is counted in the diagnostics.
    """
    target, numbers = _countdown_task(candidate, context.reference)
    equation = tagged(candidate.required_text(), answer_tag)
    if equation is None or not equation.strip():
        return Verdict(0.0, {"no_answer": 1})
    try:
        result = evaluate(equation.split("=", 1)[0])
    except DivisionByZero:
        return Verdict(0.0, {"division_by_zero": 1})
    except ExpressionError:
        return Verdict(0.0, {"malformed": 1})
    used, remaining = sorted(result.literals), list(numbers)
    for literal in used:
        if literal not in remaining:
            return Verdict(float(format_score), {"wrong_numbers": 1})
        remaining.remove(literal)
    if use_all_numbers and remaining:
        return Verdict(float(format_score), {"wrong_numbers": 1})
    return (
        Verdict(1.0) if result.value == target else Verdict(float(format_score), {"wrong_value": 1})
    )


Countdown = map_candidates(
    countdown,
    name="countdown",
    required_fields=("text", "reference"),
    diagnostics=("no_answer", "malformed", "division_by_zero", "wrong_numbers", "wrong_value"),
    check_params=_check_countdown,
)


# -- arithmetic -------------------------------------------------------------------------------
def _boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}`, braces balanced."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    depth, start = 1, starts[-1]
    for position in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[position], 0)
        if depth == 0:
            return text[start:position]
    return None


_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_LATEX_NOISE = re.compile(r"\\left|\\right|\\[,;!: ]|\$|\s")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def boxed_value(content: str) -> Fraction | None:
    """The exact value of a boxed answer that is a number or + - * / arithmetic on numbers
    (`\\frac{a}{b}`, `\\cdot`, `\\times`, thousands commas understood); None for anything else
    (`2^{10}`, `x+1`): a boxed answer is taken whole, never by its first number."""
    text = _LATEX_NOISE.sub("", content)
    for _ in range(8):  # nested fractions, innermost first
        text, count = _FRAC.subn(r"(\1)/(\2)", text)
        if not count:
            break
    text = _THOUSANDS.sub(
        "", text.replace("\\cdot", "*").replace("\\times", "*").replace("\\div", "/")
    )
    try:
        return evaluate(text.rstrip("."), unary_minus=True).value
    except ExpressionError:
        return None


def final_number(text: str) -> Fraction | None:
    """The answer a completion commits to: the value of the last `\\boxed{}` (see `boxed_value`),
    else the first number after the last `####`, else the last number (`a/b` a fraction)."""
    boxed = _boxed(text)
    if boxed is not None:
        return boxed_value(boxed)
    if _HASH in text:
        found = numbers_in(text.rsplit(_HASH, 1)[1], fractions=True)
        return found[0] if found else None
    found = numbers_in(text, fractions=True)
    return found[-1] if found else None


def _expected(item: ScoreItem, reference: Any) -> Fraction:
    """The expected result: `{'expression': '3*(4+5)'}` is evaluated; a number is taken as is."""
    source = reference.get("expression") if isinstance(reference, Mapping) else None
    if source is None and isinstance(reference, str) and as_fraction(reference) is None:
        source = reference
    if isinstance(source, str):
        try:
            return evaluate(source, unary_minus=True).value
        except ExpressionError as exc:
            raise ScoreInputError(
                f"item {item.id!r}: arithmetic reference {source!r} is not computable: {exc}"
            ) from exc
    value = as_fraction(
        reference_answer(reference) if isinstance(reference, Mapping) else reference
    )
    if value is None:
        raise ScoreInputError(
            f"item {item.id!r}: arithmetic needs a reference expression ({{'expression': "
            f"'12*7'}}) or a number, got {reference!r}"
        )
    return value


def _check_arithmetic(rel_tol: float = 0.0) -> None:
    if (
        isinstance(rel_tol, bool)
        or not isinstance(rel_tol, (int, float))
        or not 0.0 <= rel_tol < 1.0
    ):
        raise ValueError(f"arithmetic: rel_tol must be a number in [0, 1), got {rel_tol!r}")


def arithmetic(candidate: ScoreItem, context: GroupContext, rel_tol: float = 0.0) -> Verdict:
    """1.0 when the completion's final number equals the reference expression's exact value (within
    `rel_tol` of it when set: `0.333` for 1/3 needs rel_tol >= 1e-3); 0.0 otherwise."""
    expected = _expected(candidate, context.reference)
    answer = final_number(candidate.required_text())
    if answer is None:
        return Verdict(0.0, {"no_answer": 1})
    close = answer == expected or (
        rel_tol > 0 and abs(answer - expected) <= Fraction(rel_tol) * abs(expected)
    )
    return Verdict(1.0) if close else Verdict(0.0, {"wrong_answer": 1})


Arithmetic = map_candidates(
    arithmetic,
    name="arithmetic",
    required_fields=("text", "reference"),
    diagnostics=("no_answer", "wrong_answer"),
    check_params=_check_arithmetic,
)


# -- format -----------------------------------------------------------------------------------
# each tag exactly once, neither inside the other: `.*?` alone would accept
# `<think>a</think><think>b..`
THINK_ANSWER = (
    r"<think>(?:(?!</?(?:think|answer)>).)*</think>\s*"
    r"<answer>(?:(?!</?(?:think|answer)>).)*</answer>"
)
THINK_ANSWER_PARTS = ("<think>", "</think>", "<answer>", "</answer>")
_FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL, "x": re.VERBOSE}


def _compile(what: str, pattern: Any, flags: str) -> re.Pattern[str]:
    if not isinstance(pattern, str):
        raise ValueError(f"format_reward: {what} must be a string, got {pattern!r}")
    try:
        return re.compile(pattern, sum(_FLAGS[f] for f in flags))
    except re.error as exc:
        raise ValueError(f"format_reward: {what} {pattern!r} does not compile: {exc}") from exc


def _check_format(
    pattern: str = THINK_ANSWER,
    flags: str = "s",
    partial_credit: bool = False,
    parts: Sequence[str] = THINK_ANSWER_PARTS,
    partial_max: float = 0.5,
) -> None:
    if not isinstance(flags, str) or set(flags) - set(_FLAGS):
        raise ValueError(
            f"format_reward: flags must be letters of {''.join(_FLAGS)!r}, got {flags!r}"
        )
    _compile("pattern", pattern, flags)
    if not isinstance(partial_credit, bool):
        raise ValueError(f"format_reward: partial_credit must be a bool, got {partial_credit!r}")
    if isinstance(parts, str) or not isinstance(parts, Sequence) or not parts:
        raise ValueError(f"format_reward: parts must be a non-empty list of regexes, got {parts!r}")
    for index, part in enumerate(parts):
        _compile(f"parts[{index}]", part, flags)
    if (
        isinstance(partial_max, bool)
        or not isinstance(partial_max, (int, float))
        or not 0.0 <= partial_max < 1.0
    ):
        raise ValueError(
            f"format_reward: partial_max must be in [0, 1) (below a full match), got "
            f"{partial_max!r}"
        )


def format_reward(
    candidate: ScoreItem,
    context: GroupContext,
    pattern: str = THINK_ANSWER,
    flags: str = "s",
    partial_credit: bool = False,
    parts: Sequence[str] = THINK_ANSWER_PARTS,
    partial_max: float = 0.5,
) -> Verdict:
    """1.0 when the whole completion (stripped) matches `pattern`. Otherwise 0.0, or with
    `partial_credit` `partial_max` times the share of `parts` that occur exactly once."""
    text = candidate.required_text().strip()
    if _compile("pattern", pattern, flags).fullmatch(text):
        return Verdict(1.0)
    if not partial_credit:
        return Verdict(0.0, {"no_match": 1})
    found = sum(len(_compile("part", part, flags).findall(text)) == 1 for part in parts)
    return Verdict(partial_max * found / len(parts), {"no_match": 1})


FormatReward = map_candidates(
    format_reward,
    name="format_reward",
    required_fields=("text",),
    diagnostics=("no_match",),
    check_params=_check_format,
)
