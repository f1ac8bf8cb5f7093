"""MathVerifyScorer in-process, grading through real forkserver workers."""

from __future__ import annotations

import dataclasses
import time

import pytest

from scorers.base import ScoreInputError, ScoreItem, score_checked
from scorers.builtin.math_verify import MathVerifyScorer
from scorers.registry import resolve_scorer

# kill + reap + replacement + neighbours on a loaded 2-core box: the bound proves the item's
# deadline was kept against a tower that would grade for minutes without it, never a speed
SLACK_S = 8.0


@pytest.fixture
def make_scorer():
    """Build and load scorers; close every one afterwards (the leak guard checks the rest)."""
    made: list[MathVerifyScorer] = []

    def factory(**params) -> MathVerifyScorer:
        scorer = MathVerifyScorer(**params)
        made.append(scorer)
        scorer.load("cpu")
        return scorer

    yield factory
    for scorer in made:
        scorer.close()


def item(item_id: str, text: str, reference) -> ScoreItem:
    return ScoreItem(id=item_id, text=text, reference=reference)


def test_registry_and_spec():
    assert resolve_scorer("math_verify") is MathVerifyScorer
    spec = MathVerifyScorer.spec
    assert (
        spec.term_names() == ("math_verify",) and spec.env == "math" and spec.input_kind == "text"
    )


def test_correct_wrong_and_unparsable_answers(make_scorer):
    scorer = make_scorer(jobs=2, timeout_s=10.0)
    items = [
        item("right", "The answer is \\boxed{2}", "2"),
        item("wrong", "The answer is \\boxed{3}", "2"),
        item("garbage", "I have no idea, sorry.", "2"),
        item("mapping", "So $x = \\frac{1}{2}$.", {"answer": "0.5"}),
        item("number", "\\boxed{42}", 42),
    ]
    result = score_checked(scorer, items)
    assert result.terms == {"math_verify": [1.0, 0.0, 0.0, 1.0, 1.0]}
    assert result.diagnostics == {
        "timeouts": 0,
        "memory_exceeded": 0,
        "cpu_exceeded": 0,
        "memory_budget_exceeded": 0,
        "overflowed": 0,
    }


def test_plain_number_golds_grade_as_math_verify_grades_them(make_scorer):
    """A plain-number gold is parsed as math_verify's default parses it. Wrapped in \\boxed{} first,
    `1,22` was the set {1, 22} and `1 000` was 1*0. Expected values are math_verify's own
    `verify(parse(gold), parse(text))`, the same under antlr 4.9.3 and 4.13.2."""
    scorer = make_scorer(jobs=2, timeout_s=10.0)
    cases = {
        "comma-decimal": ("\\boxed{1.22}", "1,22", 1.0),
        "comma-decimal-prose": ("The answer is 1.22", "1,22", 1.0),
        "comma-decimal-not-a-set": ("\\boxed{1,22}", "1,22", 0.0),
        "negative-comma-decimal": ("\\boxed{-0.5}", "-0,5", 1.0),
        "thousands": ("\\boxed{1000}", "1,000", 1.0),
        "thousands-space": ("\\boxed{1000}", "1 000", 1.0),
        "trailing-period": ("\\boxed{3}", "3.", 1.0),
        # not ASCII: math_verify reads these only boxed; a plain-number test on \d took them raw,
        # where they parse to nothing and the whole batch was refused
        "fullwidth-digits": ("\\boxed{\uff11\uff12}", "\uff11\uff12", 1.0),
        "arabic-indic-digit": ("\\boxed{\u0663}", "\u0663", 1.0),
    }
    result = score_checked(
        scorer, [item(name, text, gold) for name, (text, gold, _) in cases.items()]
    )
    assert dict(zip(cases, result.terms["math_verify"], strict=True)) == {
        name: want for name, (_, _, want) in cases.items()
    }


@pytest.mark.slow
def test_pathological_item_costs_one_timeout_and_spares_its_neighbours(make_scorer):
    timeout_s = 2.0
    scorer = make_scorer(jobs=2, timeout_s=timeout_s)
    items = [
        item("a", "The answer is \\boxed{2}", "2"),
        item("tower", "\\boxed{9^{9^{9^{9}}}}", "1"),
        item("b", "\\boxed{7}", "8"),
        item("c", "$\\sqrt{4}$", "2"),
    ]
    # load() does not wait for the workers: their start is not the call's
    scorer._pool.wait_started(60.0)
    started = time.monotonic()
    result = score_checked(scorer, items)
    wall_s = time.monotonic() - started
    assert result.terms == {"math_verify": [1.0, 0.0, 0.0, 1.0]}
    assert result.diagnostics == {
        "timeouts": 1,
        "memory_exceeded": 0,
        "cpu_exceeded": 0,
        "memory_budget_exceeded": 0,
        "overflowed": 1,
    }
    assert wall_s < timeout_s + SLACK_S
    # The replacement worker serves the next call normally.
    again = score_checked(scorer, [item("d", "\\boxed{5}", "5")])
    assert again.terms == {"math_verify": [1.0]}


def test_unparsable_gold_is_an_input_error_and_the_scorer_keeps_serving(make_scorer):
    scorer = make_scorer(jobs=2, timeout_s=10.0)
    with pytest.raises(ScoreInputError, match=r"items\[1\] \(id='bad-gold'\).*cannot be parsed"):
        scorer.score([item("ok", "\\boxed{1}", "1"), item("bad-gold", "\\boxed{1}", "")])
    assert scorer.score([item("ok", "\\boxed{1}", "1")]).terms == {"math_verify": [1.0]}


def test_missing_or_malformed_reference_is_an_input_error(make_scorer):
    scorer = make_scorer(jobs=1, timeout_s=10.0)
    with pytest.raises(ScoreInputError, match="required"):
        score_checked(scorer, [item("x", "\\boxed{1}", None)])
    with pytest.raises(ScoreInputError):
        scorer.score([item("x", "\\boxed{1}", ["not", "a", "mapping"])])


def test_score_before_load_and_after_close_raises():
    scorer = MathVerifyScorer(jobs=1, timeout_s=5.0)
    with pytest.raises(RuntimeError, match="before load"):
        scorer.score([item("x", "\\boxed{1}", "1")])
    scorer.load()
    scorer.close()
    scorer.close()
    with pytest.raises(RuntimeError):
        scorer.score([item("x", "\\boxed{1}", "1")])


def test_params_are_validated(monkeypatch):
    monkeypatch.delenv("MATH_VERIFY_TIMEOUT_S", raising=False)
    assert MathVerifyScorer().timeout_s == 10.0
    assert MathVerifyScorer().jobs >= 1
    monkeypatch.setenv("MATH_VERIFY_TIMEOUT_S", "3.5")
    assert MathVerifyScorer().timeout_s == 3.5
    assert MathVerifyScorer(timeout_s=1).timeout_s == 1.0
    for bad in ("soon", "0", "-1", "nan"):
        monkeypatch.setenv("MATH_VERIFY_TIMEOUT_S", bad)
        with pytest.raises(ValueError, match="MATH_VERIFY_TIMEOUT_S"):
            MathVerifyScorer()
    with pytest.raises(ValueError):
        MathVerifyScorer(timeout_s=0.0)
    with pytest.raises(TypeError):
        MathVerifyScorer(timeout_s="5")
    with pytest.raises(ValueError):
        MathVerifyScorer(jobs=0, timeout_s=1.0)
    with pytest.raises(TypeError):
        MathVerifyScorer(jobs=1.5, timeout_s=1.0)
    with pytest.raises(TypeError):
        MathVerifyScorer(strict="yes", timeout_s=1.0)
    with pytest.raises(ValueError):
        MathVerifyScorer(numeric_precision=0, timeout_s=1.0)
    with pytest.raises(TypeError):
        MathVerifyScorer(unknown=1)


@pytest.mark.slow
def test_on_timeout_raise_fails_the_batch_instead_of_scoring_zero(make_scorer):
    from scorers.builtin.math_verify import MathGradeTimeout

    scorer = make_scorer(jobs=2, timeout_s=1.0, on_timeout="raise")
    with pytest.raises(MathGradeTimeout, match=r"\['tower'\]"):
        scorer.score([item("a", "\\boxed{2}", "2"), item("tower", "\\boxed{9^{9^{9^{9}}}}", "1")])
    assert scorer.score([item("a", "\\boxed{2}", "2")]).terms == {"math_verify": [1.0]}


def test_on_timeout_must_be_known():
    with pytest.raises(ValueError, match="on_timeout"):
        MathVerifyScorer(on_timeout="ignore")


def test_a_missing_grader_package_fails_load_not_the_first_call():
    """load() does not wait for the pool, so a missing package is checked before it starts: a boot
    failure."""

    class Lacking(MathVerifyScorer):
        spec = dataclasses.replace(
            MathVerifyScorer.spec, requires_modules=("math_verify", "no_such_package_xyz")
        )

    scorer = Lacking(jobs=1, timeout_s=5.0)
    with pytest.raises(ModuleNotFoundError, match="lacks no_such_package_xyz"):
        scorer.load()
    assert scorer._pool is None
