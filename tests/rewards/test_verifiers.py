"""Rule verifiers: exact, numeric, math-verify and the built-in task dispatch."""

from __future__ import annotations

import threading

import pytest

from rlctl.rewards.verifiers import builtin_score, exact_match, last_number, math_match, numeric_match


def test_exact_match():
    assert exact_match("s", " yes\n", "yes") == 1.0
    assert exact_match("s", "yes<|eos|>", "yes") == 1.0
    assert exact_match("s", "Yes", "yes") == 0.0
    assert exact_match("s", "", "yes") == 0.0


@pytest.mark.parametrize(
    ("text", "want", "score"),
    [
        ("The answer is 42.", "42", 1.0),
        ("so 1,234 apples", 1234, 1.0),
        ("-3.50", "-3.5", 1.0),
        ("first 42 then 43", "42", 0.0),
        ("no number", "42", 0.0),
        ("1e3", "1000", 1.0),
    ],
)
def test_numeric_match(text, want, score):
    assert numeric_match("s", text, want) == score


def test_last_number():
    assert last_number("a 1 b 2.5 c") == 2.5
    assert last_number("none") is None


@pytest.mark.parametrize(
    ("text", "gold", "score"),
    [
        ("The answer is $\\boxed{\\frac{1}{2}}$", "0.5", 1.0),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("$x = 2\\sqrt{2}$", "\\sqrt{8}", 1.0),
        ("\\boxed{3}", "4", 0.0),
        ("I do not know", "4", 0.0),
    ],
)
def test_math_match(text, gold, score):
    assert math_match("math", text, gold) == score


def test_math_match_works_off_the_main_thread():
    got = []
    t = threading.Thread(target=lambda: got.append(math_match("m", "\\boxed{\\frac{2}{4}}", "1/2")))
    t.start()
    t.join(30)
    assert got == [1.0]


def test_builtin_dispatch():
    assert builtin_score("rlctl/addition", "46", "46") == 1.0
    assert builtin_score("rlctl/countdown", "(3+5)*2", {"target": 16, "numbers": [3, 5, 2]}) == 1.0
    with pytest.raises(KeyError, match="no built-in verifier"):
        builtin_score("openai/gsm8k", "1", "1")
