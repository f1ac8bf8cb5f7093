"""Importing this grades a few typical answers, so the forkserver that preloads it is warm.

math_verify builds its parsers' prediction caches and sympy its caches lazily, on first
use. Every grading worker is a fork of the forkserver: warmed there, a fresh worker (a
replacement for a killed or overflowed one) grades its first items in milliseconds
instead of up to half a second, and so does not itself pass the soft deadline.
"""

from __future__ import annotations

from scorers.builtin.math_verify_grade import grade

# one of each shape the parsers and sympy see most: integer, fraction, percent, decimal,
# polynomial, radical, set, and a wrong answer
WARM_UP = (
    ("\\boxed{42}", "42"),
    ("\\boxed{\\frac{1}{3}}", "0.3333333333333333"),
    ("\\boxed{12\\%}", "0.12"),
    ("The answer is 3.5.", "$\\frac{7}{2}$"),
    ("\\boxed{(x+3)^2}", "$x^2+6x+9$"),
    ("\\boxed{\\sqrt{8}}", "$2\\sqrt{2}$"),
    ("\\boxed{1, 2}", "$\\{1, 2\\}$"),
    ("so $x = 5$", "4"),
)

for _prediction, _gold in WARM_UP:
    grade(_prediction, _gold, 6, 15, True)
