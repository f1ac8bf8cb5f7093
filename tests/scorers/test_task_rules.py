"""Task rule rewards (gsm8k, countdown, arithmetic, format_reward): verdicts, the safe evaluator,
refusals naming the item, and the same verdicts in-process and in a managed child (envs/image)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from scorers.builtin.arithmetic import (
    MAX_DEPTH,
    DivisionByZero,
    MalformedExpression,
    evaluate,
    numbers_in,
)
from supervisor import LocalRewardBackend, RewardItem, RewardRequest, ScorerRequestError
from tests.conftest import env_python

GSM8K_GOLD = (
    "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether.\n#### 72"
)


def score(name: str, items: list[RewardItem], **params) -> tuple[list[float], dict]:
    with LocalRewardBackend(name, params=params) as backend:
        response = backend.compute_rewards(RewardRequest(items=items))
    return response.rewards, response.diagnostics[name]["values"]


def item(text: str, reference, n: int = 0) -> RewardItem:
    return RewardItem(id=f"i{n}", text=text, reference=reference)


# -- the evaluator -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("(6 - 1) × 4", 20),
        ("6/4*2", 3),
        ("100 ÷ 8", Fraction(25, 2)),
        ("1 − 2 − 3", -4),
        ("2*(3+(4*5))", 46),
    ],
)
def test_evaluator_computes_exactly(text, value):
    assert evaluate(text).value == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1+",
        "(1+2",
        "1+2)",
        "2**3",
        "-1+2",
        "__import__('os')",
        "1 2",
        "2^3",
        "1e9",
        "(" * (MAX_DEPTH + 1) + "1",
    ],
)
def test_evaluator_refuses_anything_else(text):
    with pytest.raises(MalformedExpression):
        evaluate(text)


def test_evaluator_division_by_zero_is_its_own_error_and_unary_minus_is_opt_in():
    with pytest.raises(DivisionByZero):
        evaluate("4 / (2 - 2)")
    assert evaluate("-3 + -(2*2)", unary_minus=True).value == -7
    assert evaluate("3 + 4 * 5").literals == (3, 4, 5)


def test_numbers_are_normalised():
    assert numbers_in("It costs $1,234.50, i.e. 42.0 apples or 50% of -7.") == [
        Fraction("1234.5"),
        42,
        50,
        -7,
    ]
    # a binary minus
    assert numbers_in("5-3") == [5, 3] and numbers_in("total is 10 - 7") == [10, 7]
    assert numbers_in("the answer is -7") == [-7] and numbers_in("x = (2) - 4") == [2, 4]
    assert numbers_in("7/2", fractions=True) == [Fraction(7, 2)]
    assert numbers_in("#### 1,0000")[0] == 1  # not 10000: a comma group has exactly three digits
    # e-notation is never read as its mantissa
    assert numbers_in("about 1e5 or 2.5E-3 apples") == []


# -- gsm8k -------------------------------------------------------------------------------------
def test_gsm8k_final_answer_match():
    items = [
        item("48/2 = 24, so 48 + 24 = 72.\n#### 72", GSM8K_GOLD, 0),
        item("She sold 72.0 clips in total.", GSM8K_GOLD, 1),  # last number, trailing .0
        item("#### $72 clips", {"answer": 72}, 2),  # currency and units
        item("#### 71", "72", 3),
        item("I do not know.", "72", 4),
        item("#### 1,234", "1234", 5),  # thousands commas
    ]
    rewards, counts = score("gsm8k", items)
    assert rewards == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    assert counts == {"no_answer": 1, "wrong_answer": 1}
    strict, _ = score("gsm8k", items, extraction="hash", format_score=0.1)
    assert strict == [1.0, 0.0, 1.0, 0.1, 0.0, 1.0]


def test_gsm8k_refusals_name_the_item():
    with pytest.raises(ScorerRequestError, match="'i3'.*gsm8k needs a reference with a number"):
        score("gsm8k", [item("#### 1", "1", 0), item("#### 1", "no number here", 3)])
    with pytest.raises(ValueError, match="extraction must be one of"):
        LocalRewardBackend("gsm8k", params={"extraction": "first"})


# -- countdown ---------------------------------------------------------------------------------
TASK = {"target": 24, "numbers": [4, 6, 1, 1]}


@pytest.mark.parametrize(
    ("completion", "reward", "counted"),
    [
        # 1 used 3 times
        ("<think>...</think><answer>(6 - 1 - 1) * 4 + 1 - 1</answer>", 0.0, "wrong_numbers"),
        ("<think>...</think><answer>(1 + 1) * 6 + 4 * 1</answer>", 0.0, "wrong_numbers"),
        ("<answer>6 * 4 * 1 * 1</answer>", 1.0, None),
        ("<answer>(6 * 4) / (1 * 1) = 24</answer>", 1.0, None),  # what follows '=' is ignored
        ("<answer>6 * 4 + 1 + 1</answer>", 0.0, "wrong_value"),
        ("<answer>6 * 4 / (1 - 1)</answer>", 0.0, "division_by_zero"),
        ("<answer>__import__('os').system('true')</answer>", 0.0, "malformed"),
        ("<answer>6 ** 4 + 1 + 1</answer>", 0.0, "malformed"),
        ("(6*4)*1*1 with no tag", 0.0, "no_answer"),
        # the last tag counts
        ("<answer>6*4*1*1</answer> then <answer>6+4+1+1</answer>", 0.0, "wrong_value"),
    ],
)
def test_countdown(completion, reward, counted):
    rewards, counts = score("countdown", [item(completion, TASK)])
    assert rewards == [reward]
    assert set(counts) == {
        "no_answer",
        "malformed",
        "division_by_zero",
        "wrong_numbers",
        "wrong_value",
    }
    assert counts == {name: int(name == counted) for name in counts}


def test_countdown_is_linear_in_a_hostile_completion():
    import time

    began = time.monotonic()
    rewards, counts = score(
        "countdown", [item("<answer>" * 40_000, TASK), item("</answer>" * 40_000, TASK, 1)]
    )
    assert rewards == [0.0, 0.0] and counts["no_answer"] == 2
    assert time.monotonic() - began < 2.0  # a lazy regex took minutes on these 320 KB


def test_countdown_options_and_refusals():
    assert score("countdown", [item("<answer>6*4</answer>", TASK)], use_all_numbers=False)[0] == [
        1.0
    ]
    assert score("countdown", [item("<answer>6*4+1+1</answer>", TASK)], format_score=0.1)[0] == [
        0.1
    ]
    assert score(
        "countdown", [item("6 * 4 * 1 * 1", {"target": 24, "nums": [1, 1, 4, 6]})], answer_tag=None
    )[0] == [1.0]
    with pytest.raises(ScorerRequestError, match="item 'i0': countdown needs a reference like"):
        score("countdown", [item("<answer>1</answer>", {"target": 24})])
    with pytest.raises(ValueError, match="answer_tag must be a tag name"):
        LocalRewardBackend("countdown", params={"answer_tag": "<answer>"})


# -- arithmetic --------------------------------------------------------------------------------
def test_arithmetic_compares_the_final_number_with_the_exact_result():
    items = [
        item(r"12 * 7 = \boxed{84}", {"expression": "12*7"}, 0),
        item("So the result is 3.5.", {"expression": "7/2"}, 1),
        item(r"\boxed{\frac{7}{2}}", "7/2", 2),  # a bare expression string is evaluated too
        item("#### 0.333", {"expression": "1/3"}, 3),
        item("-3", {"expression": "-(1+2)"}, 4),
        item("no digits", {"answer": 5}, 5),
    ]
    rewards, counts = score("arithmetic", items)
    assert rewards == [1.0, 1.0, 1.0, 0.0, 1.0, 0.0] and counts == {
        "no_answer": 1,
        "wrong_answer": 1,
    }
    boxed = [
        (r"\boxed{\frac{-1}{2}}", "-1/2", 1.0),
        (r"\boxed{\frac{-1}{2}}", "-1", 0.0),  # the whole box, never its first number
        (r"\boxed{2^{10}}", "2", 0.0),
        (r"\boxed{10^3}", "10", 0.0),
        (r"\boxed{\frac{1}{2}+1}", "3/2", 1.0),
        (r"\boxed{\frac{1}{2}+1}", "1/2", 0.0),
        (r"\boxed{1,000}", "1000", 1.0),
        (r"\boxed{\dfrac{\frac{1}{2}}{3}}", {"expression": "1/6"}, 1.0),
    ]
    got, _ = score("arithmetic", [item(text, gold, n) for n, (text, gold, _) in enumerate(boxed)])
    assert got == [want for _, _, want in boxed]
    assert score("arithmetic", items[3:4], rel_tol=1e-3)[0] == [1.0]
    with pytest.raises(
        ScorerRequestError, match="item 'i0': arithmetic reference '1/0' is not computable"
    ):
        score("arithmetic", [item("1", {"expression": "1/0"})])


# -- format ------------------------------------------------------------------------------------
def test_format_reward_full_and_partial_credit():
    items = [
        item("<think>reason</think>\n<answer>42</answer>", None, 0),
        item("<think>reason</think> 42", None, 1),
        item("42", None, 2),
        item("<think>a</think><think>b</think><answer>1</answer>", None, 3),
    ]
    nested = item("<think>x <answer>y</answer></think><answer>b</answer>", None, 9)
    assert score("format_reward", [nested])[0] == [0.0]  # a tag inside the other is not the format
    assert score("format_reward", items) == ([1.0, 0.0, 0.0, 0.0], {"no_match": 3})
    partial, _ = score("format_reward", items, partial_credit=True)
    # 2 of 4 tags once -> 0.5 * 2/4; duplicated think tags don't count
    assert partial == [1.0, 0.25, 0.0, 0.25]
    boxed, _ = score("format_reward", items[2:], pattern=r"\d+")
    assert boxed == [1.0, 0.0]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"pattern": "(unclosed"}, "pattern '\\(unclosed' does not compile"),
        ({"parts": ["ok", "[bad"]}, "parts\\[1\\] '\\[bad' does not compile"),
        ({"flags": "q"}, "flags must be letters"),
        ({"partial_max": 1.0}, "partial_max must be in"),
        ({"patern": "x"}, "unexpected keyword argument 'patern'"),
    ],
)
def test_format_reward_refuses_bad_params_at_construction(params, message):
    with pytest.raises((ValueError, TypeError), match=message):
        LocalRewardBackend("format_reward", params=params)


# -- the same verdicts in a managed child ------------------------------------------------------
CASES = {
    "gsm8k": ([item("#### 72", GSM8K_GOLD, 0), item("71", GSM8K_GOLD, 1), item("?", "3", 2)], {}),
    "countdown": (
        [item("<answer>6*4*1*1</answer>", TASK, 0), item("<answer>6/0</answer>", TASK, 1)],
        {},
    ),
    "arithmetic": ([item(r"\boxed{84}", {"expression": "12*7"}, 0), item("85", "84", 1)], {}),
    "format_reward": (
        [item("<think>x</think><answer>1</answer>", None, 0), item("<think>x", None, 1)],
        {},
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_managed_child_gives_the_in_process_verdicts(managed, name):
    items, params = CASES[name]
    request = RewardRequest(items=items)
    with LocalRewardBackend(name, params=params) as local:
        expected = local.compute_rewards(request)
    backend = managed(env_python("image"), name, params=params)
    got = backend.compute_rewards(request)
    assert got.rewards == expected.rewards and got.diagnostics == expected.diagnostics
    assert got.identity_hash == expected.identity_hash


@pytest.mark.slow
def test_managed_child_refuses_a_bad_reference_naming_the_item_and_keeps_serving(managed):
    backend = managed(env_python("image"), "countdown")
    with pytest.raises(ScorerRequestError) as info:
        backend.compute_rewards(
            RewardRequest(items=[item("<answer>1</answer>", {"numbers": [1]}, 7)])
        )
    assert info.value.status == 422 and "item 'i7'" in str(info.value)
    assert backend.compute_rewards(
        RewardRequest(items=[item("<answer>6*4*1*1</answer>", TASK)])
    ).rewards == [1.0]
