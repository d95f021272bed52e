"""Rule verifiers: exact, numeric, math (the final answer only, by value) and the built-in task dispatch."""

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
        ("$x = \\boxed{2\\sqrt{2}}$", "\\sqrt{8}", 1.0),
        ("so the answer is\n#### 72", "72", 1.0),
        ("7 + 5 = 12", "12", 1.0),
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


@pytest.mark.parametrize(
    ("text", "gold"),
    [
        # the prompt restated: math-verify used to parse "23+45" out of the sentence and evaluate it
        ("The number 23+45 is a classic example of a mathematical identity", "68"),
        ("What is 23 + 45? Let me think about 23 + 45.", "68"),
        ("$23+45$", "68"),
        ("\\boxed{23+45}", "68"),  # an unevaluated sum is the question, not an answer
        ("\\boxed{7 \\times 5}", "35"),
        ("$\\frac{1}{2}$ is the fraction asked about, not an answer", "\\frac{1}{2}"),
        ("68 is the sum of 23 and 45", "68"),  # the last number is 45
        ("\\boxed{68} but wait, maybe \\boxed{67}", "68"),  # the last box counts
        ("#### 68\nno, #### 69", "68"),  # the last #### counts
        ("", "68"),
        ("   ", "68"),
        ("<|im_end|>68", "68"),  # after the end marker: not part of the response
        ("٦٨", "68"),  # Arabic-Indic digits are not read as numbers
        ("６８", "68"),  # full-width digits neither
        ("\\boxed{\\frac{1}{2}", "\\frac{1}{2}"),  # an unclosed box is no answer
        ("\\boxed{}", "0"),
    ],
)
def test_math_match_compares_only_the_final_answer(text, gold):
    assert math_match("m", text, gold) == 0.0


@pytest.mark.parametrize(
    ("text", "gold"),
    [
        ("so 23+45 = 68", "68"),
        ("The number 23+45 is a classic example. \\boxed{68}", "68"),
        ("23 + 45 = 68, so\n#### 68", "68"),
        ("-3.50", "-3.5"),
        ("$1,234.50$", "1234.5"),
        ("\\boxed{1{,}234}", "1234"),
        ("\\boxed{\\text{68}}", "68"),
        ("\\boxed{\\textbf{68}\\,}", "68"),
        ("$\\boxed{\\left(\\frac{\\sqrt{2}}{2}\\right)}$.", "\\frac{1}{\\sqrt{2}}"),
        ("\\boxed{\\frac{\\frac{1}{2}}{2}}", "\\frac14"),  # nested braces
        ("the answer is \u22125", "-5"),  # U+2212 minus sign
        ("\\boxed{68 apples}", "68"),
        ("\\boxed 5$ done", "5"),
        ("so 0.50", "\\frac{1}{2}"),
        ("x = " + "9" * 5000, "9" * 5000),  # huge: compared exactly, no float overflow
        ("\\boxed{68}", "Natalia sold 48/2 = 24 clips. 48+24 = 72... \\boxed{68}"),  # boxed ground truth
        ("\\boxed{72}", "48+24 = 72\n#### 72"),  # a GSM8K solution as ground truth
        ("42", 42),
    ],
)
def test_math_match_accepts_the_final_answer_by_value(text, gold):
    assert math_match("m", text, gold) == 1.0


def test_math_match_huge_numbers_differ_exactly():
    assert math_match("m", "9" * 5000 + "8", "9" * 5001) == 0.0
    assert math_match("m", "1" + "0" * 400, "1" + "0" * 399 + "1") == 0.0  # both overflow a float


def test_math_match_huge_response_is_bounded():
    text = "blah 23+45 " * 20000 + "\\boxed{" + "x+" * 3000 + "1}"
    assert math_match("m", text, "68") == 0.0  # a 6000-character "answer" is never handed to sympy
