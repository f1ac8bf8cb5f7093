"""One JSON parse for every JSON route, bounded in memory and in nesting whatever the body holds.

`json.loads` builds far more than its text: `[{},{},...]` takes ~26 bytes per byte of body,
`[0,0,...]` ~6, and a string whose text is ASCII but holds one `\\ud83d\\ude00` escape takes 4 bytes
a character. So before the parse a structural pre-scan (a few `bytes.count` and regular-expression
searches: C speed, no object made per value) prices what the parse can build, at most:

    text_width * len(body)        the decoded text, at its widest character's width (1, 2 or 4
                                  bytes)
  + string_width * len(body)      the strings and numbers made of that text (one character per byte
                                  at most; twice that when the body has escapes: such a string is
                                  built in a growing buffer, widened when a wider character comes,
                                  ~1.6 x its size at worst)
  + UNIT_BYTES * units            128 bytes per value, member, container or string, counted as the
                                  `,` `:` `[` `{` and quote pairs of the body: inside strings too,
                                  so a bound (CPython 3.11 with this parser builds ~30-45 bytes per
                                  unit)

and refuses a body priced over PARSE_FACTOR times the route's body cap (`JsonTooLarge`, a 413): the
parse never builds more than PARSE_FACTOR * cap, so peak growth while a body at the cap is read and
parsed is at most (PARSE_FACTOR + 1) * cap (measured in tests/ops/test_json_bodies.py). Marks inside
strings count: source code (one of `,` `:` `[` `{` every 10 bytes) is priced ~15 bytes a byte, so ~4
MiB of it fits the OpenRLHF route's default 16 MiB cap; a longer body needs a larger cap.

The parse is the json module's own Python scanner (strings through its C `scanstring`), with arrays
and objects counted as they open: nesting past `max_depth` is refused (`JsonTooDeep`, a 400) before
it recurses further. Its Python frames let other threads run every switch interval, where the C
scanner holds the GIL for a whole parse (an event loop would stall behind it however it is
threaded). It takes a few microseconds a value: a parse at the bound (~500,000 values under a 16 MiB
cap) takes seconds, one of OpenRLHF's calls (a dozen values, long strings) milliseconds. Stdlib
only: the child's routes and any reader of untrusted JSON can share it.
"""

from __future__ import annotations

import json
import json.scanner
import re
from dataclasses import dataclass
from typing import Any

from child_runtime.protocol.items import RequestError

# what the parse builds, priced before it, is at most this many times the route's body cap
PARSE_FACTOR = 4
UNIT_BYTES = 128  # the price of one value, member, container or string (measured: ~30-45 on 3.11)
# nesting of arrays and objects; deeper is refused before the parse recurses further
DEFAULT_MAX_DEPTH = 64

_ESCAPED_PAIRS = (b"\\\\", b'\\"')  # removed in this order: every quote left delimits a string
# each value, member or container needs one (or a quote pair)
_UNIT_MARKS = (b",", b":", b"[", b"{")
# a character past U+FFFF: 4 bytes each in its string
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abAB]")
_WIDE_ESCAPE = re.compile(rb"\\u(?!00)")  # past U+00FF: 2 bytes each
_ASTRAL_BYTE = re.compile(rb"[\xf0-\xf4]")  # the lead byte of a 4-byte UTF-8 sequence
_WIDE_BYTE = re.compile(rb"[\xc4-\xef]")  # lead bytes of characters past U+00FF


class JsonTooLarge(RequestError):
    """Parsing the body could build more than the route allows (answered 413 before any parse)."""


class JsonTooDeep(RequestError):
    """Arrays and objects nested deeper than the route allows (answered 400)."""


@dataclass(frozen=True)
class JsonBounds:
    """A route's bounds: its body cap in bytes (the parse may build PARSE_FACTOR times that) and
    nesting."""

    max_bytes: int
    max_depth: int = DEFAULT_MAX_DEPTH

    @property
    def parse_budget(self) -> int:
        return PARSE_FACTOR * self.max_bytes


def price(body: bytes) -> tuple[int, int]:
    """(the most bytes parsing `body` can build, the units counted): see the module docstring."""
    escaped = b"\\" in body
    plain = (
        body.replace(_ESCAPED_PAIRS[0], b"").replace(_ESCAPED_PAIRS[1], b"") if escaped else body
    )
    units = 1 + plain.count(b'"') // 2 + sum(plain.count(mark) for mark in _UNIT_MARKS)
    text_width = _text_width(body)
    # a string with escapes is built in a growing buffer, widened in place when a wider character
    # comes: up to ~1.6 x its final size for a moment (the json module's C scanstring)
    strings = max(text_width, _escape_width(plain)) * 2 if escaped else text_width
    return (text_width + strings) * len(body) + UNIT_BYTES * units, units


def loads(body: bytes, bounds: JsonBounds) -> Any:
    """The body's JSON value, parsed within `bounds`; RequestError (or JsonTooLarge, JsonTooDeep)
    otherwise. Runs for as long as the parse (seconds at the bound): call it off the event loop."""
    priced, units = price(body)
    if priced > bounds.parse_budget:
        raise JsonTooLarge(
            f"parsing this body could take ~{priced >> 20} MiB ({units} values or members and "
            f"{len(body)} bytes of text), over this route's {bounds.parse_budget >> 20} MiB "
            f"({PARSE_FACTOR} x its {bounds.max_bytes} byte cap): send fewer or smaller "
            f"values, or raise the cap"
        )
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"the body is not UTF-8 (byte {exc.start}: {exc.reason})") from exc
    decoder = json.JSONDecoder()
    decoder.scan_once = json.scanner.py_make_scanner(_Nesting(decoder, bounds.max_depth))  # type: ignore[attr-defined]
    try:
        return decoder.decode(text)
    except json.JSONDecodeError as exc:
        raise RequestError(
            f"the body is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    except RequestError:
        raise
    except ValueError as exc:  # a number past Python's digit limit
        raise RequestError(f"the body is not readable JSON: {str(exc)[:120]}") from exc


class _Nesting:
    """What `py_make_scanner` reads from its decoder, with each array and object counted while it is
    open."""

    def __init__(self, decoder: Any, max_depth: int) -> None:
        self.strict, self.memo = decoder.strict, {}  # type: ignore[var-annotated]
        self.parse_string, self.parse_float = decoder.parse_string, decoder.parse_float
        self.parse_int, self.parse_constant = decoder.parse_int, decoder.parse_constant
        self.object_hook, self.object_pairs_hook = None, None
        # json.decoder's JSONArray, JSONObject
        self._array, self._object = decoder.parse_array, decoder.parse_object
        self.depth, self.max_depth = 0, max_depth

    def parse_array(self, s_and_end: tuple[str, int], scan_once: Any) -> Any:
        self._enter(s_and_end[1])
        try:
            return self._array(s_and_end, scan_once)
        finally:
            self.depth -= 1

    def parse_object(
        self, s_and_end: tuple[str, int], strict: bool, scan_once: Any, *hooks_and_memo: Any
    ) -> Any:
        self._enter(s_and_end[1])
        try:
            return self._object(s_and_end, strict, scan_once, *hooks_and_memo)
        finally:
            self.depth -= 1

    def _enter(self, at: int) -> None:
        self.depth += 1
        if self.depth > self.max_depth:
            raise JsonTooDeep(
                f"the body nests arrays and objects deeper than {self.max_depth} (at "
                f"character {at})"
            )


def _escape_width(plain: bytes) -> int:
    """Bytes a character takes in the widest string its \\u escapes make."""
    return 4 if _SURROGATE_ESCAPE.search(plain) else 2 if _WIDE_ESCAPE.search(plain) else 1


def _text_width(body: bytes) -> int:
    """Bytes a character of the decoded body takes: its widest character's."""
    if body.isascii():
        return 1
    return 4 if _ASTRAL_BYTE.search(body) else 2 if _WIDE_BYTE.search(body) else 1
