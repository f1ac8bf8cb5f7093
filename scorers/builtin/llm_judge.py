"""llm_judge: a reward from any OpenAI-compatible chat-completions endpoint.

Each item becomes one chat request built from a prompt template; the judge's reply is
parsed into a number in a declared range (normalised to [0, 1]) or one of declared
choices. A reply that cannot be parsed, a number outside the range, or a call that failed
after its retries is that item's failure (`ScoreResult.failed`), never a 0: a panel gives
those items nothing from an optional term and raises for a required one, naming them. Calls run
concurrently up to `concurrency`; each attempt has a deadline; transient failures (connect errors,
timeouts, dropped connections, 408/429/5xx, a malformed body) are retried with the same request
bytes under capped exponential backoff, all inside the batch's absolute deadline. The API key is
read from the environment variable that `api_key_env` names: the name is identity, the secret never
appears in identity, logs or errors. With `endpoint_limit`, every attempt first takes a lease of the
endpoint's shared limit (`scorers.limits`: every process of the node calling that endpoint shares
it); a wait that would pass the batch deadline is the item's failure, naming the endpoint and the
limit.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import queue
import re
import string
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

from scorers import tail
from scorers.base import ScoreInputError, ScoreItem, Scorer, ScoreResult, ScorerSpec
from scorers.common.retry import Retry
from scorers.diagnostics import mean
from scorers.limits import (
    Coordination,
    EndpointLease,
    EndpointLimit,
    EndpointLimiter,
    LimitError,
    open_limiter,
)

DEFAULT_TEMPLATE = (
    "Rate how well the response answers the question, from 0 (wrong or useless) to 10 (fully "
    "correct and helpful).\n\nQuestion:\n{prompt}\n\nResponse:\n{completion}\n\n"
    "Give a one-sentence reason, then end with a line of the form 'Score: N'."
)
PLACEHOLDERS = ("prompt", "completion", "reference")
PARSERS = ("number", "choice")
NUMBER_PATTERN = r"(?i)\bscore\s*[:=]?\s*\**\s*(-?\d+(?:\.\d+)?)(?![\w]|\.\d)"  # `1e1` is not 1
# then a choice label
CHOICE_LEAD = r"(?i)\b(?:verdict|answer|choice)\b(?:\s*(?:[:=]|is))?\s*\**\s*[\[(]?\s*"
# past the batch deadline, how long score() waits for a worker thread to notice it
WAKE_MARGIN_S = 1.0
# no attempt begins closer than this to the batch deadline, nor does a lease of the endpoint limit
START_MARGIN_S = 0.05
MAX_ANSWER_BYTES = 1 << 20  # a chat completion is kilobytes; more is a broken or hostile server
RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
THROTTLE_STATUSES = frozenset({429, 503})  # the endpoint asks for less: the shared window halves
BYTES_PER_TOKEN = 4  # a request's tokens, estimated before the call from its body's size
WAITED_S = 0.001  # a lease that took longer than this counts as a wait (`limit_waits`)


class _Retryable(Exception):
    def __init__(
        self, message: str, retry_after: float | None = None, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.retry_after, self.status = retry_after, status


class _Final(Exception):
    """No retry helps: a 4xx the request caused, a reply that does not parse."""

    def __init__(self, message: str, counted: str | None = None) -> None:
        super().__init__(message)
        self.counted = counted


class _Late(Exception):
    """The batch deadline passed before this item's next attempt could begin."""


@dataclass
class _Outcome:
    value: float | None = None
    error: str | None = None
    attempts: int = 0
    counted: str | None = None
    seconds: float = 0.0
    limit_waits: int = 0
    limit_wait_s: float = 0.0


def _positive(name: str, value: Any, integer: bool = False) -> None:
    kinds = (int,) if integer else (int, float)
    if (
        isinstance(value, bool)
        or not isinstance(value, kinds)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(
            f"llm_judge: {name} must be a positive {'int' if integer else 'number'}, got {value!r}"
        )


def _template_fields(template: Any) -> set[str]:
    if not isinstance(template, str) or not template.strip():
        raise ValueError("llm_judge: prompt_template must be a non-empty string")
    fields = set()
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(
            f"llm_judge: prompt_template does not parse ({exc}); write literal braces as {{{{ }}}}"
        ) from exc
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in PLACEHOLDERS or spec or conversion:
            raise ValueError(
                f"llm_judge: prompt_template placeholder {{{name}}} is not one of "
                f"{list(PLACEHOLDERS)}"
            )
        fields.add(name)
    if "completion" not in fields:
        raise ValueError("llm_judge: prompt_template must contain {completion}")
    return fields


def _is_loopback(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _endpoint_limit(
    value: Mapping[str, Any] | None, base_url: str
) -> tuple[EndpointLimit | None, Coordination | None]:
    """The `endpoint_limit` param: the limits, and the coordinator that holds them across nodes
    (its `coordinator:` and `nodes:`, or the environment's; None: this node's files)."""
    if value is None:
        return None, None
    if not isinstance(value, Mapping):
        return EndpointLimit.from_param(value, base_url), None  # refused there, with the form
    limits, coordination = Coordination.split(value)
    return EndpointLimit.from_param(limits, base_url), coordination


def _checked_url(base_url: Any) -> SplitResult:
    """`base_url` split, once it is known to be an http(s) URL that carries no credentials."""
    url = urlsplit(base_url) if isinstance(base_url, str) else None
    if url is None or url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(
            f"llm_judge: base_url must be an http(s) URL like 'http://host:8000/v1', got "
            f"{base_url!r}"
        )
    if url.username or url.password:
        raise ValueError(
            "llm_judge: base_url must not carry credentials; name an env var in api_key_env"
        )
    return url


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_parser(parser: Any, score_range: Any, choices: Any) -> None:
    """The parser is known, and what it maps a verdict with (a range, or choices) makes sense."""
    if parser not in PARSERS:
        raise ValueError(f"llm_judge: parser must be one of {list(PARSERS)}, got {parser!r}")
    if parser == "number":
        if (
            isinstance(score_range, (str, bytes))
            or not isinstance(score_range, Sequence)
            or len(score_range) != 2
            or not all(_is_real(v) for v in score_range)
            or not math.isfinite(score_range[0])
            or not math.isfinite(score_range[1])
            or score_range[0] >= score_range[1]
        ):
            raise ValueError(
                f"llm_judge: score_range must be [low, high] with low < high, got {score_range!r}"
            )
    elif not (
        isinstance(choices, Mapping)
        and choices
        and all(isinstance(k, str) and k for k in choices)
        and all(_is_real(v) and math.isfinite(v) for v in choices.values())
    ):
        raise ValueError(
            f"llm_judge: parser 'choice' needs choices like {{'A': 1.0, 'B': 0.0}}, got {choices!r}"
        )
    if parser == "choice" and len({label.casefold() for label in choices or {}}) != len(
        choices or {}
    ):
        raise ValueError(
            f"llm_judge: choices must differ other than by case, got {sorted(choices or {})}"
        )


def _answer_pattern(
    parser: str, choices: Mapping[str, float] | None, answer_pattern: str | None
) -> re.Pattern[str]:
    """The pattern whose one group is the verdict: the caller's, or the parser's default."""
    labels = "|".join(re.escape(label) for label in sorted(choices or {}, key=len, reverse=True))
    default = NUMBER_PATTERN if parser == "number" else rf"{CHOICE_LEAD}({labels})(?!\w)"
    try:
        pattern = re.compile(answer_pattern or default)
    except (re.error, TypeError) as exc:
        raise ValueError(
            f"llm_judge: answer_pattern {answer_pattern!r} does not compile: {exc}"
        ) from exc
    if pattern.groups != 1:
        raise ValueError(
            f"llm_judge: answer_pattern must have exactly one group, got {answer_pattern!r}"
        )
    return pattern


def _check_request_options(temperature: Any, extra_body: Any, api_key_env: Any) -> None:
    if not _is_real(temperature) or not 0 <= temperature <= 2:
        raise ValueError(f"llm_judge: temperature must be in [0, 2], got {temperature!r}")
    if extra_body is not None and not isinstance(extra_body, Mapping):
        raise ValueError("llm_judge: extra_body must be a mapping (merged into each request body)")
    if api_key_env is not None and not (
        isinstance(api_key_env, str) and re.fullmatch(r"[A-Za-z_]\w*", api_key_env)
    ):
        raise ValueError(
            f"llm_judge: api_key_env must name an environment variable, got {api_key_env!r}"
        )


def _checked_prompt(
    template: Any,
    system_prompt: Any,
    parser: Any,
    score_range: Any,
    choices: Any,
    answer_pattern: Any,
) -> tuple[set[str], re.Pattern[str]]:
    """What the judge is asked and how its verdict is read, checked: the template's placeholders
    and the verdict's pattern."""
    fields = _template_fields(template)
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise ValueError("llm_judge: system_prompt must be a string or None")
    _check_parser(parser, score_range, choices)
    return fields, _answer_pattern(parser, choices, answer_pattern)


def _check_timeouts(
    request_timeout_s: Any, backoff_s: Any, backoff_max_s: Any, batch_timeout_s: Any
) -> None:
    """Each timeout and backoff is a positive number of seconds."""
    for name, value in (("request_timeout_s", request_timeout_s), ("backoff_s", backoff_s)):
        _positive(name, value)
    for name, value in (("backoff_max_s", backoff_max_s), ("batch_timeout_s", batch_timeout_s)):
        _positive(name, value)


def _check_counts(max_tokens: Any, concurrency: Any, max_attempts: Any) -> None:
    """Each count is a positive int."""
    for name, value in (
        ("max_tokens", max_tokens),
        ("concurrency", concurrency),
        ("max_attempts", max_attempts),
    ):
        _positive(name, value, integer=True)


class LlmJudge(Scorer):
    """A judge model's verdict on each completion, from an OpenAI-compatible endpoint."""

    spec = ScorerSpec(
        name="llm_judge",
        input_kind="text",
        required_fields=("text",),
        terms=("llm_judge",),
        revision="1",
        env="image",
        report_packages=("httpx",),
        requires_modules=("httpx",),
        diagnostics=(
            "attempts",
            "retries",
            "failed",
            "unparsable",
            "out_of_range",
            "latency_s",
            "limit_waits",
            "limit_wait_s",
            "call_s",  # each item's judging time (its retries included), as a histogram
            "slowest",  # the slowest items: (id, seconds)
        ),
        # how hard the endpoint may be called, never what it answers
        nonsemantic_params=("endpoint_limit",),
    )

    def __init__(  # noqa: PLR0913 - its params, each a recipe `params:` key (they make its identity)
        self,
        base_url: str,
        model: str,
        prompt_template: str = DEFAULT_TEMPLATE,
        system_prompt: str | None = None,
        parser: str = "number",
        score_range: Sequence[float] = (0, 10),
        choices: Mapping[str, float] | None = None,
        answer_pattern: str | None = None,
        temperature: float = 0.0,
        max_tokens: int = 256,
        extra_body: Mapping[str, Any] | None = None,
        api_key_env: str | None = None,
        concurrency: int = 8,
        request_timeout_s: float = 60.0,
        max_attempts: int = 3,
        backoff_s: float = 0.5,
        backoff_max_s: float = 8.0,
        batch_timeout_s: float = 300.0,
        endpoint_limit: Mapping[str, Any] | None = None,
    ) -> None:
        url = _checked_url(base_url)
        self.endpoint_limit, self.coordination = _endpoint_limit(endpoint_limit, base_url)
        if not isinstance(model, str) or not model:
            raise ValueError(f"llm_judge: model must be a non-empty string, got {model!r}")
        self.fields, self.pattern = _checked_prompt(
            prompt_template, system_prompt, parser, score_range, choices, answer_pattern
        )
        _check_request_options(temperature, extra_body, api_key_env)
        _check_timeouts(request_timeout_s, backoff_s, backoff_max_s, batch_timeout_s)
        _check_counts(max_tokens, concurrency, max_attempts)
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.host = url.hostname
        self.model, self.template, self.system_prompt = model, prompt_template, system_prompt
        self.parser, self.range, self.choices = parser, tuple(score_range), dict(choices or {})
        self.temperature, self.max_tokens = temperature, max_tokens
        self.extra_body = dict(extra_body or {})
        self.api_key_env, self.concurrency = api_key_env, concurrency
        self.request_timeout_s, self.max_attempts = float(request_timeout_s), max_attempts
        self.backoff_s, self.backoff_max_s = float(backoff_s), float(backoff_max_s)
        self.batch_timeout_s = float(batch_timeout_s)
        self._secret: str | None = None
        self._limiter: EndpointLimiter | None = None
        self._loaded = False

    def load(self, device: str = "cpu") -> None:
        import httpx  # noqa: F401 - refused at start, not at the first batch, where it is missing

        if self.api_key_env is not None:
            secret = os.environ.get(self.api_key_env)
            if not secret:
                raise RuntimeError(
                    f"llm_judge: environment variable {self.api_key_env} (api_key_env) is not set"
                )
            if not re.fullmatch(r"[\x21-\x7e]+", secret):  # never echoed: it may be most of the key
                raise RuntimeError(
                    f"llm_judge: the value of {self.api_key_env} (api_key_env) has "
                    f"whitespace, control or "
                    "non-ASCII characters (a trailing newline from a mounted secret?); it "
                    "cannot be a bearer token"
                )
            self._secret = secret
        if self.endpoint_limit is not None and self._limiter is None:
            self._limiter = open_limiter(self.endpoint_limit, self.coordination)
        self._loaded = True

    def close(self) -> None:
        self._loaded = False
        if self._limiter is not None:
            self._limiter.close()
            self._limiter = None

    def _client(self) -> Any:
        """A client for one batch: a connection a stuck attempt still holds never serves the next
        one."""
        from scorers.common import bounded_http

        # a loopback judge never goes through a proxy; a remote one follows the environment's
        return bounded_http.client(
            self.url, trust_env=not _is_loopback(self.host), max_connections=self.concurrency
        )

    # -- requests ---------------------------------------------------------------------------
    def _request(self, item: ScoreItem) -> bytes:
        """The exact bytes sent on every attempt for this item (a retry never changes the
        request)."""
        values = {"completion": item.required_text()}
        if "prompt" in self.fields:
            if item.prompt is None:
                raise ScoreInputError(
                    f"item {item.id!r}: field 'prompt' is required by the judge's prompt_template"
                )
            values["prompt"] = item.prompt
        if "reference" in self.fields:
            if item.reference is None:
                raise ScoreInputError(
                    f"item {item.id!r}: a reference is required by the judge's prompt_template"
                )
            reference = item.reference
            values["reference"] = (
                reference if isinstance(reference, str) else json.dumps(reference, sort_keys=True)
            )
        messages = [{"role": "user", "content": self.template.format(**values)}]
        if self.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        body = {
            **self.extra_body,
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        # ASCII escapes: a lone surrogate in a completion cannot fail it
        return json.dumps(body).encode()

    def _scrub(self, text: str) -> str:
        """The text with the key blanked, however it was quoted; call it before cutting text
        short."""
        if self._secret:
            for form in {self._secret, json.dumps(self._secret)[1:-1], repr(self._secret)[1:-1]}:
                text = text.replace(form, "***")
        return text

    def _attempt(self, client: Any, body: bytes, deadline: float) -> tuple[str, int | None]:
        """One POST, answered in whole by min(request_timeout_s, what the batch has left); the
        reply's text and the tokens its `usage` says it took (None when it says nothing)."""
        import httpx

        from scorers.common import bounded_http

        attempt_deadline = min(deadline, time.monotonic() + self.request_timeout_s)
        headers = {"content-type": "application/json"}
        if self._secret:
            headers["authorization"] = f"Bearer {self._secret}"
        try:  # bounded in time and in size, however the server trickles or compresses
            answer = bounded_http.exchange(
                client,
                "POST",
                self.url,
                attempt_deadline,
                MAX_ANSWER_BYTES,
                content=body,
                headers=headers,
            )
        except httpx.TimeoutException as exc:
            raise _Retryable(
                f"no whole answer within {self.request_timeout_s:g} s ({type(exc).__name__})"
            ) from exc
        except bounded_http.AnswerRefused as exc:
            raise _Final(str(exc)) from exc
        # our request: a retry cannot help
        except (httpx.LocalProtocolError, httpx.UnsupportedProtocol) as exc:
            raise _Final(self._scrub(f"{type(exc).__name__}: {exc}")) from exc
        except httpx.TransportError as exc:
            raise _Retryable(self._scrub(f"{type(exc).__name__}: {exc}")) from exc
        status, retry_after = answer.status, answer.headers.get("retry-after")
        excerpt = self._scrub(answer.body.decode("utf-8", "replace"))[:200]
        if status != 200:
            message = f"HTTP {status}: {excerpt}"
            if status in RETRY_STATUSES:
                raise _Retryable(message, _seconds(retry_after), status)
            raise _Final(message)
        return _content(answer.body, excerpt)

    def _limited(self, client: Any, body: bytes, deadline: float, outcome: _Outcome) -> str:
        """One attempt, inside a lease of the endpoint's shared limit when it has one; the lease
        is told how the attempt went (tokens used, a throttle and its Retry-After, the latency)."""
        if self._limiter is None:
            outcome.attempts += 1
            return self._attempt(client, body, deadline)[0]
        lease = self._lease(body, deadline, outcome)
        outcome.attempts += 1
        began = time.monotonic()
        try:
            content, used = self._attempt(client, body, deadline)
        except _Retryable as exc:
            throttled = exc.status in THROTTLE_STATUSES
            lease.end(throttled=throttled, retry_after_s=exc.retry_after if throttled else None)
            raise
        except BaseException:
            lease.end()
            raise
        lease.end(tokens_used=used, latency_s=time.monotonic() - began)
        return content

    def _lease(self, body: bytes, deadline: float, outcome: _Outcome) -> EndpointLease:
        """The endpoint's leave to send `body`, waited for within the deadline; past it, the
        item's failure naming the endpoint and the limit (never retried against the endpoint)."""
        assert self._limiter is not None
        estimate = math.ceil(len(body) / BYTES_PER_TOKEN) + self.max_tokens
        try:
            lease = self._limiter.acquire(estimate, deadline - START_MARGIN_S)
        except LimitError as exc:
            raise _Final(f"endpoint limit: {exc}") from exc
        if lease.waited_s > WAITED_S:
            outcome.limit_waits += 1
            outcome.limit_wait_s += lease.waited_s
        return lease

    def _verdict(self, content: str) -> float:
        found = self.pattern.findall(content)
        answer = found[-1] if found else content.strip().strip(".*").strip()
        shown = self._scrub(content)[-160:]
        if self.parser == "choice":
            folded = {label.casefold(): value for label, value in self.choices.items()}
            if answer.casefold() not in folded:
                raise _Final(
                    f"unparsable verdict (expected one of {sorted(self.choices)}): {shown!r}",
                    "unparsable",
                )
            return float(folded[answer.casefold()])
        try:
            number = float(answer)
        except ValueError:
            raise _Final(f"unparsable score (no 'Score: N'): {shown!r}", "unparsable") from None
        low, high = self.range
        if not (math.isfinite(number) and low <= number <= high):
            raise _Final(
                f"score {number:g} outside score_range [{low:g}, {high:g}]: {shown!r}",
                "out_of_range",
            )
        return (number - low) / (high - low)

    def _judge(self, client: Any, body: bytes, deadline: float) -> _Outcome:
        outcome, began = _Outcome(), time.monotonic()

        def attempt() -> float:
            # an item that waited for a free slot past the deadline
            if deadline - time.monotonic() < START_MARGIN_S:
                raise _Late(
                    f"the batch deadline ({self.batch_timeout_s:g} s) passed before attempt "
                    f"{outcome.attempts + 1}"
                )
            return self._verdict(self._limited(client, body, deadline, outcome))

        retrying = Retry(
            deadline,
            self.backoff_s,
            self.backoff_max_s,
            retry_on=(_Retryable,),
            max_tries=self.max_attempts,
            asked_pause=lambda exc: (
                (exc.retry_after or 0.0) if isinstance(exc, _Retryable) else 0.0
            ),
        )
        try:
            outcome.value = retrying.call(attempt)
        except _Late as exc:
            outcome.error = str(exc)
        except _Final as exc:
            outcome.error, outcome.counted = str(exc), exc.counted
        except _Retryable as exc:
            if retrying.gave_up == "tries":
                outcome.error = f"{outcome.attempts} attempts failed; last: {exc}"
            else:
                outcome.error = (
                    f"batch deadline ({self.batch_timeout_s:g} s) leaves no time for attempt "
                    f"{outcome.attempts + 1}; last: {exc}"
                )
        outcome.seconds = time.monotonic() - began
        return outcome

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        if not self._loaded:
            raise RuntimeError("llm_judge: score() before load()")
        bodies = [self._request(item) for item in items]  # refusals before any call
        deadline = time.monotonic() + self.batch_timeout_s
        results = self._judge_all(bodies, deadline)
        late = (
            f"no verdict by the batch deadline ({self.batch_timeout_s:g} s): the server held "
            f"its attempt open"
        )
        outcomes = [
            # no verdict in time: it took the whole batch deadline
            outcome if outcome is not None else _Outcome(error=late, seconds=self.batch_timeout_s)
            for outcome in list(results)
        ]
        return self._result(outcomes, [item.id for item in items])

    def _judge_all(self, bodies: list[bytes], deadline: float) -> list[_Outcome | None]:
        """Each body judged on up to `concurrency` threads, waited for until the batch deadline;
        None where no verdict came by then (the list is live: a late thread may still fill it)."""
        results: list[_Outcome | None] = [None] * len(bodies)
        work: queue.SimpleQueue[tuple[int, bytes]] = queue.SimpleQueue()
        for index, body in enumerate(bodies):
            work.put((index, body))
        finished = threading.Semaphore(0)
        client = self._client()

        def judge_until_empty() -> None:
            while True:
                try:
                    index, body = work.get_nowait()
                except queue.Empty:
                    return
                results[index] = self._judge(client, body, deadline)
                finished.release()

        # daemon threads: a stuck one never holds up exit
        for n in range(min(self.concurrency, len(bodies))):
            threading.Thread(target=judge_until_empty, name=f"llm_judge-{n}", daemon=True).start()
        try:
            for _ in bodies:  # one deadline for the batch, whatever the attempts do
                if not finished.acquire(
                    timeout=max(deadline - time.monotonic(), 0.0) + WAKE_MARGIN_S
                ):
                    break
        finally:
            # the batch's connections end here; an attempt still on one fails at once
            client.close()
        return results

    def _result(self, outcomes: list[_Outcome], ids: list[str]) -> ScoreResult:
        """The verdicts as the term, failures with where they came from, and what the calls took."""
        attempts = sum(o.attempts for o in outcomes)
        counted = Counter(o.counted for o in outcomes if o.counted)
        return ScoreResult(
            terms={"llm_judge": [math.nan if o.value is None else o.value for o in outcomes]},
            diagnostics={
                "attempts": attempts,
                "retries": attempts - len(outcomes),
                "failed": sum(o.error is not None for o in outcomes),
                "unparsable": counted["unparsable"],
                "out_of_range": counted["out_of_range"],
                "latency_s": mean(sum(o.seconds for o in outcomes), len(outcomes)),
                "limit_waits": sum(o.limit_waits for o in outcomes),
                "limit_wait_s": mean(
                    sum(o.limit_wait_s for o in outcomes), sum(o.limit_waits for o in outcomes)
                ),
                "call_s": tail.histogram(o.seconds for o in outcomes),
                "slowest": tail.slowest(zip(ids, (o.seconds for o in outcomes), strict=True)),
            },
            failed={
                position: f"{o.error} ({f'{o.attempts} attempts ' if o.attempts else ''}at "
                f"{self.url}, model {self.model!r})"
                for position, o in enumerate(outcomes)
                if o.error is not None
            },
        )


def _content(body: bytes, excerpt: str) -> tuple[str, int | None]:
    """A chat completion's reply text, and its `usage`'s tokens (None when it has none)."""
    try:
        answer = json.loads(body)
        content = answer["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise _Retryable(f"malformed chat completion ({type(exc).__name__}): {excerpt!r}") from exc
    if not isinstance(content, str):
        raise _Retryable(f"malformed chat completion: message content is {type(content).__name__}")
    usage = answer.get("usage") if isinstance(answer, dict) else None
    return content, _tokens(usage) if isinstance(usage, dict) else None


def _tokens(usage: dict[str, Any]) -> int | None:
    """The tokens a `usage` block counts: its total, else prompt plus completion."""
    counts: list[Any] = [usage.get("total_tokens")]
    if not _is_real(counts[0]):
        counts = [usage.get("prompt_tokens"), usage.get("completion_tokens")]
    numbers = [float(c) for c in counts if _is_real(c) and math.isfinite(c) and c >= 0]
    return int(sum(numbers)) if len(numbers) == len(counts) else None


def _seconds(retry_after: str | None) -> float | None:
    """Retry-After in seconds (the HTTP-date form is ignored: backoff applies)."""
    try:
        return max(float(retry_after), 0.0) if retry_after is not None else None
    except ValueError:
        return None
