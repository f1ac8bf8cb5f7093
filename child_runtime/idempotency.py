"""Answers remembered by idempotency key, so that a retried /score is never scored twice.

A client that lost the answer (a reset connection, a proxy that timed out) cannot know
whether the child scored: it re-sends the same request with the same key, and gets the
same bytes back. A retry that arrives while the first is still being scored waits for
that result. Only successful answers are kept, within a bounded window (entries, age,
bytes); a failure is forgotten, so its retry scores again.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from child_runtime.protocol.headers import KEY_HEADER

MAX_KEY_CHARS = 200
HASH_IN_THREAD_BYTES = 1 << 20  # hashlib drops the GIL: keep the event loop free for a large body


class IdempotencyConflict(Exception):
    """The key was already used for a different request body."""


class BadKey(ValueError):
    """The key header is empty, too long or not printable ASCII."""


def check_key(key: str) -> str:
    if not (0 < len(key) <= MAX_KEY_CHARS and key.isascii() and key.isprintable()):
        raise BadKey(
            f"{KEY_HEADER} must be 1..{MAX_KEY_CHARS} printable ASCII characters, got {key[:40]!r}"
        )
    return key


async def body_digest(body: bytes) -> bytes:
    if len(body) >= HASH_IN_THREAD_BYTES:
        return await asyncio.to_thread(lambda: hashlib.sha256(body).digest())
    return hashlib.sha256(body).digest()


@dataclass
class _Entry:
    digest: bytes
    # bytes: the answer; an Exception: the first request failed with it; None: it was cancelled
    outcome: asyncio.Future[bytes | Exception | None]
    expires: float = float("inf")  # the age limit starts when the answer is in
    size: int = 0


class AnswerCache:
    """At most `max_entries` keys, each answer kept `ttl_s` seconds, `max_bytes` of answers in all
    (an answer larger than that is not kept). Oldest entries go first. One event loop only."""

    def __init__(
        self,
        max_entries: int = 256,
        ttl_s: float = 300.0,
        max_bytes: int = 64 << 20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries, self.ttl_s, self.max_bytes = max_entries, ttl_s, max_bytes
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0
        self.replays = 0

    @property
    def entries(self) -> int:
        return len(self._entries)

    async def answer(
        self, key: str, digest: bytes, produce: Callable[[], Awaitable[bytes]]
    ) -> tuple[bytes, bool]:
        """The answer for `key`, and whether it is a replay (`produce` was not called for it)."""
        while (entry := self._lookup(key)) is not None:
            if entry.digest != digest:
                raise IdempotencyConflict(
                    f"{KEY_HEADER} {key[:40]!r} was already used for a different request"
                )
            if entry.outcome.done():
                outcome = entry.outcome.result()
            else:  # shielded: a retry that gives up must not cancel the first
                outcome = await asyncio.shield(entry.outcome)
            if isinstance(outcome, Exception):
                # the answer the first request got: its failure is not cached for later retries
                raise outcome
            if outcome is not None:
                self.replays += 1
                return outcome, True
            # the first request was cancelled before it had an answer: this one scores instead
        entry = _Entry(digest, asyncio.get_running_loop().create_future())
        self._entries[key] = entry
        self._shrink()
        try:
            answer = await produce()
        except BaseException as exc:
            self._drop(key, entry)
            entry.outcome.set_result(exc if isinstance(exc, Exception) else None)
            raise
        entry.outcome.set_result(answer)
        if key in self._entries and self._entries[key] is entry:
            if len(answer) > self.max_bytes:
                self._drop(key, entry)
            else:
                entry.expires, entry.size = self._clock() + self.ttl_s, len(answer)
                self._bytes += entry.size
                self._entries.move_to_end(key)
                self._shrink()
        return answer, False

    def _lookup(self, key: str) -> _Entry | None:
        now = self._clock()
        for stale in [k for k, e in self._entries.items() if e.expires <= now]:
            self._drop(stale, self._entries[stale])
        return self._entries.get(key)

    def _shrink(self) -> None:
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            key, entry = next(iter(self._entries.items()))
            self._drop(key, entry)

    def _drop(self, key: str, entry: _Entry) -> None:
        if self._entries.get(key) is entry:
            del self._entries[key]
            self._bytes -= entry.size
