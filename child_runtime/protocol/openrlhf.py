"""OpenRLHF's reward protocol, for both of its routes: `serve`'s URL route and the reward_func file.

OpenRLHF 0.11.2 hands over `query` (prompt + response decoded with special tokens kept),
`prompts` (the prompt alone) and `labels` (the dataset's label column), and reads `rewards`,
`scores` and `extra_logs`. The response is the query with its prompt cut from the front (else
from its last occurrence; a query without it is refused), then with special tokens such as
`</s>`, `<|im_end|>` or `<|endoftext|>` stripped from both ends (tokens written `<...>` or
`<|...|>`, repeated; none inside the text is touched). The label is the reference. OpenRLHF
passes no group id, so a groupwise scorer cannot be served: both routes refuse one at start.
Stdlib only (plus the wire's item checks): the child and the trainer side both import it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from child_runtime.protocol.items import RequestError
from scorers.base import ScoreResult

ROUTE = "/openrlhf"  # served at ROUTE/<secret>: the secret is checked before routing, then cut off
# <|im_end|>, <|endoftext|>, <|eot_id|> ...; </s>, <s>; <eos>, <bos>, <pad>, <unk>, <end_of_turn>
# ...
_SPECIAL_TOKEN = (
    r"(?:<\|[^<>|\s]{1,40}\|>|</?s>|<(?:eos|bos|pad|unk|eot|end_of_turn|start_of_turn)>)"
)
_AT_ENDS = re.compile(rf"^(?:\s*{_SPECIAL_TOKEN})+|(?:{_SPECIAL_TOKEN}\s*)+$")


class Sample(NamedTuple):
    prompt: str
    response: str
    label: Any


class ItemsFailed(RuntimeError):
    """The scorer could not score some items (a judge reply that does not parse): no reward for
    them."""


def groupwise_refusal(names: Sequence[str]) -> str:
    return (
        f"OpenRLHF sends one sample per call and no group id: the groupwise scorer(s) "
        f"{list(names)} cannot score"
    )


def response_of(query: str, prompt: str) -> str:
    """The response inside OpenRLHF's query: the prompt cut off, special tokens stripped at both
    ends."""
    if query.startswith(prompt):
        response = query[len(prompt) :]
    elif prompt and prompt in query:
        response = query[query.rindex(prompt) + len(prompt) :]
    else:
        raise RequestError("the query does not contain its prompt: cannot tell the response apart")
    return _AT_ENDS.sub("", response).strip()


def samples(queries: Sequence[Any], prompts: Sequence[Any], labels: Sequence[Any]) -> list[Sample]:
    """One sample per query; the three lists of one length, queries and prompts strings."""
    if not len(queries) == len(prompts) == len(labels):
        raise RequestError(
            f"{len(queries)} queries, {len(prompts)} prompts, {len(labels)} labels: lengths differ"
        )
    found = []
    for index, (query, prompt, label) in enumerate(zip(queries, prompts, labels, strict=True)):
        if not isinstance(query, str) or not isinstance(prompt, str):
            raise RequestError(f"query[{index}] and prompts[{index}] must be strings")
        found.append(Sample(prompt, response_of(query, prompt), label))
    return found


def samples_of(payload: Any) -> list[Sample]:
    """OpenRLHF's request body, parsed (`protocol/bounded_json`): `labels` may be left out (None
    each); other keys are ignored."""
    if not isinstance(payload, dict):
        raise RequestError(
            'the body must be a JSON object {"query": [...], "prompts": [...], "labels": [...]}'
        )
    queries, prompts = payload.get("query"), payload.get("prompts")
    labels = payload.get("labels", [None] * len(queries) if isinstance(queries, list) else None)
    if not (isinstance(queries, list) and isinstance(prompts, list) and isinstance(labels, list)):
        raise RequestError('"query", "prompts" and "labels" must be lists')
    if not queries:
        raise RequestError('"query" is empty: nothing to score')
    return samples(queries, prompts, labels)


def wire_request(found: Sequence[Sample]) -> dict[str, Any]:
    """The samples as a score request, so that the wire's own item checks and limits apply."""
    return {
        "items": [
            {
                "id": str(index),
                "prompt": sample.prompt,
                "text": sample.response,
                "reference": sample.label,
            }
            for index, sample in enumerate(found)
        ]
    }


def answer(rewards: Sequence[float], logs: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """What OpenRLHF reads: floats for a one-sample call (it makes `torch.tensor([reward])` of it),
    lists otherwise; `scores` equal to `rewards`; `extra_logs` each term's value."""
    if len(rewards) == 1:
        one = {name: values[0] for name, values in logs.items()}
        return {"rewards": rewards[0], "scores": rewards[0], "extra_logs": one}
    return {
        "rewards": list(rewards),
        "scores": list(rewards),
        "extra_logs": {k: list(v) for k, v in logs.items()},
    }


def answer_of(
    result: ScoreResult, terms: Sequence[str], reward_term: str | None = None
) -> dict[str, Any]:
    """One scorer's result: the reward is the sum of its terms (a client's default weights), or its
    `reward_term` (a served panel's weighted reward; then the other terms are the logs)."""
    if result.failed:
        reasons = "; ".join(
            f"sample {position}: {why}" for position, why in sorted(result.failed.items())
        )
        raise ItemsFailed(f"the scorer could not score {len(result.failed)} sample(s): {reasons}")
    # the reward is every term's sum: none may be missing
    for term, whys in result.term_failed.items():
        reasons = "; ".join(f"sample {position}: {why}" for position, why in sorted(whys.items()))
        raise ItemsFailed(f"term {term!r} failed for {len(whys)} sample(s): {reasons}")
    # a served panel's term that does not apply to a sample logs 0.0 there
    where = result.not_applicable
    values = {
        name: [
            0.0 if i in where.get(name, ()) else float(v) for i, v in enumerate(result.terms[name])
        ]
        for name in terms
        if name != reward_term
    }
    if reward_term is not None:
        return answer([float(v) for v in result.terms[reward_term]], values)
    rewards = [math.fsum(column) for column in zip(*values.values(), strict=True)]
    return answer(rewards, values)
