"""A safe evaluator of + - * / and parentheses over exact fractions, and number parsing for answers.

Rule rewards grade expressions a policy wrote (countdown) and compute expected results
(arithmetic). `eval` would run anything the policy writes; this recursive-descent parser
accepts only numbers, the four operators (ASCII or × ÷ −) and parentheses, bounded in
length and nesting, and computes with `Fraction` so 6/4*2 is exactly 3. Stdlib only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction

MAX_LENGTH = 512  # characters: a countdown equation is tens of characters
MAX_DEPTH = 32  # nested parentheses

_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|([-+*/()×÷−]))")
_SYMBOL = {"×": "*", "÷": "/", "−": "-"}


class ExpressionError(ValueError):
    """The text is not an expression this evaluator accepts."""


class MalformedExpression(ExpressionError):
    """Not numbers, + - * / and parentheses in a valid order (or too long or too deep)."""


class DivisionByZero(ExpressionError):
    """The expression divides by zero somewhere."""


@dataclass(frozen=True)
class Evaluated:
    value: Fraction
    literals: tuple[Fraction, ...]  # every number written, in order (countdown checks them)


def _tokens(text: str) -> list[str]:
    tokens, position = [], 0
    text = text.rstrip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            raise MalformedExpression(
                f"unexpected {text[position:].lstrip()[:12]!r} at character {position}"
            )
        number, symbol = match.groups()
        tokens.append(number if number is not None else _SYMBOL.get(symbol, symbol))
        position = match.end()
    return tokens


class _Parser:
    def __init__(self, tokens: list[str], unary_minus: bool) -> None:
        self.tokens, self.at, self.unary_minus = tokens, 0, unary_minus
        self.literals: list[Fraction] = []

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise MalformedExpression("the expression ends early")
        self.at += 1
        return token

    def expression(self, depth: int) -> Fraction:
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            value = value + self.term(depth) if self.take() == "+" else value - self.term(depth)
        return value

    def term(self, depth: int) -> Fraction:
        value = self.factor(depth)
        while self.peek() in ("*", "/"):
            operator, right = self.take(), self.factor(depth)
            if operator == "*":
                value *= right
            elif right == 0:
                raise DivisionByZero("division by zero")
            else:
                value /= right
        return value

    def factor(self, depth: int) -> Fraction:
        token = self.take()
        if token == "(":
            if depth >= MAX_DEPTH:
                raise MalformedExpression(f"parentheses nested deeper than {MAX_DEPTH}")
            value = self.expression(depth + 1)
            if self.take() != ")":
                raise MalformedExpression("a '(' is not closed")
            return value
        if token == "-" and self.unary_minus:
            return -self.factor(depth)
        if token[0].isdigit():
            literal = Fraction(Decimal(token))
            self.literals.append(literal)
            return literal
        raise MalformedExpression(f"expected a number or '(', got {token!r}")


def evaluate(text: str, unary_minus: bool = False) -> Evaluated:
    """The exact value of `text`; `ExpressionError` when it is not a bounded + - * / expression.

    Unary minus is refused unless allowed: a countdown equation combines the given numbers
    with binary operators only.
    """
    if len(text) > MAX_LENGTH:
        raise MalformedExpression(f"longer than {MAX_LENGTH} characters")
    parser = _Parser(_tokens(text), unary_minus)
    if not parser.tokens:
        raise MalformedExpression("empty expression")
    value = parser.expression(0)
    if parser.peek() is not None:
        raise MalformedExpression(f"unexpected {parser.peek()!r} after a complete expression")
    return Evaluated(value, tuple(parser.literals))


# A number as answers write it: sign, optional currency, digits grouped by commas (exactly three
# per group) or not, decimals. A number in e-notation (`1e5`) is not read as one: never as 1.
NUMBER = re.compile(
    r"(?<![\w.])(?<![eE][-+])(-|−)?\s?\$?\s?(\d{1,3}(?:,\d{3})+(?![\d,])|\d+)(\.\d+)?(?:\s?/\s?(\d+))?(?![\d.]*[eE][-+]?\d)"
)
_OPERAND_END = re.compile(r"[\d)\]}]\s*$")  # what a binary minus follows: `10 - 7` has no -7 in it


def numbers_in(text: str, fractions: bool = False) -> list[Fraction]:
    """Every number in `text`, normalised: commas and currency dropped, `42.0` == `42`, units
    ignored.

    With `fractions`, `a/b` (digits both sides) is one number; otherwise it is two. A minus after
    a number or a closing bracket is an operator, not a sign.
    """
    found = []
    for match in NUMBER.finditer(text):
        sign, whole, decimals, denominator = match.groups()
        if sign and _OPERAND_END.search(text, 0, match.start()):
            sign = None
        try:
            value = Fraction(Decimal(whole.replace(",", "") + (decimals or "")))
        except InvalidOperation as exc:  # the pattern admits only digits: a parse failure is a bug
            raise AssertionError(f"number pattern matched {match.group(0)!r}") from exc
        if fractions and denominator is not None and not decimals:
            if int(denominator) == 0:
                continue
            value /= int(denominator)
        found.append(-value if sign else value)
        if not fractions and denominator is not None:
            found.append(Fraction(int(denominator)))
    return found


def as_fraction(value: object) -> Fraction | None:
    """A number given as an int, float or numeric string (a reference's answer); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return (
            Fraction(Decimal(repr(value)))
            if value == value and abs(value) != float("inf")
            else None
        )
    if isinstance(value, str):
        found = numbers_in(value.strip(), fractions=True)
        stripped = NUMBER.sub("", value.strip(), count=1).strip(" %.")
        return found[0] if len(found) == 1 and not stripped else None
    return None
