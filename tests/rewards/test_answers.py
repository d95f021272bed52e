"""Final-answer extraction and comparison: properties over generated responses."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rlctl.rewards.answers import (
    after_hashes,
    canonical_number,
    equivalent,
    final_answer,
    is_unevaluated_arithmetic,
    last_boxed,
    last_number,
)
from rlctl.rewards.verifiers import math_match

# Prose that carries no answer marker of its own (no box, no ####) and no end marker (text after
# "<|eos|>" is not part of the response).
_prose = st.text(
    alphabet=st.characters(blacklist_characters="#\\", blacklist_categories=("Cs",)), max_size=120
).filter(lambda s: "<|" not in s)
_wordy = st.text(alphabet=st.sampled_from("abcdefghij ,;:?!()'\n"), max_size=60)


def test_last_boxed():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{\\{1, 2\\}}") == "\\{1, 2\\}"  # escaped braces do not close the box
    assert last_boxed("\\fbox{7}") == "7"
    assert last_boxed("\\boxed 7$ and") == "7"
    assert last_boxed("\\boxed{7") is None
    assert last_boxed("no box") is None


def test_after_hashes_and_last_number():
    assert after_hashes("work\n#### 1,234 apples\nbye") == "1,234 apples"
    assert after_hashes("#### \n") is None
    assert last_number("from 3-4 to -5.25, then 1,234,567") == "1,234,567"
    assert last_number("pages 3-4") == "4"
    assert last_number("x = -.5") == "-.5"
    assert last_number("no digits ٤٢") is None


def test_final_answer_priority():
    assert final_answer("#### 3 and \\boxed{4} and 5") == "4"
    assert final_answer("1 then\n#### 3\n and 5") == "3"
    assert final_answer("1 then 2") == "2"
    assert final_answer("") is None


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("1,234.50", "1234.5"),
        ("-0.0", "0"),
        ("+7", "7"),
        ("007", "7"),
        (".5", "0.5"),
        ("$-3$", "-3"),
        ("\\text{12}\\,", "12"),
        ("12 apples", "12"),
        ("12.", "12"),
        ("1/2", None),
        ("7+5", None),
        ("5 x", None),  # a one-letter "unit" is a variable
        ("1,23", None),
    ],
)
def test_canonical_number(text, want):
    assert canonical_number(text) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("23+45", True),
        ("7 \\times 5", True),
        ("-2 - 3", True),
        ("-3", False),
        ("1/2", False),
        ("2^{10}", False),
    ],
)
def test_is_unevaluated_arithmetic(text, want):
    assert is_unevaluated_arithmetic(text) is want


@settings(max_examples=200, deadline=None)
@given(n=st.integers(-(10**60), 10**60), commas=st.booleans(), zeros=st.integers(0, 3))
def test_canonical_number_is_exact_for_any_integer(n, commas, zeros):
    written = (f"{n:,}" if commas else str(n)) + ("." + "0" * zeros if zeros else "")
    assert canonical_number(written) == str(n)


@settings(max_examples=200, deadline=None)
@given(d=st.decimals(allow_nan=False, allow_infinity=False, places=4, min_value=-(10**9), max_value=10**9))
def test_canonical_number_of_decimals_is_their_value(d):
    written = f"{d:f}"
    got = canonical_number(written)
    assert got is not None and Decimal(got) == d


@settings(max_examples=200, deadline=None)
@given(prefix=_prose, n=st.integers(-(10**12), 10**12), m=st.integers(-(10**12), 10**12))
def test_only_the_box_counts_whatever_comes_before(prefix, n, m):
    assume(n != m)
    text = f"{prefix} \\boxed{{{n}}}"
    assert math_match("m", text, str(n)) == 1.0
    assert math_match("m", text, str(m)) == 0.0


@settings(max_examples=200, deadline=None)
@given(
    before=_wordy, after=_wordy, a=st.integers(1, 10**6), b=st.integers(1, 10**6), op=st.sampled_from("+*")
)
def test_a_restated_question_never_scores(before, after, a, b, op):
    """The prompt's expression restated in prose, with no answer, never equals its value."""
    value = a + b if op == "+" else a * b
    assume(value != b)
    for text in (
        f"{before}{a}{op}{b}{after}",
        f"{before}${a} {op} {b}${after}",
        f"{before}\\boxed{{{a}{op}{b}}}",
    ):
        assert math_match("m", text, str(value)) == 0.0, text


@settings(max_examples=200, deadline=None)
@given(before=_wordy, a=st.integers(0, 10**6), b=st.integers(0, 10**6))
def test_a_worked_equation_scores_by_its_result(before, a, b):
    assert math_match("m", f"{before}{a} + {b} = {a + b}", str(a + b)) == 1.0


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=300), gold=st.sampled_from(["68", "-3.5", "1234", "0"]))
def test_any_text_scores_zero_or_one_without_raising(text, gold):
    assert math_match("m", text, gold) in (0.0, 1.0)


def test_equivalent_symbolic():
    assert equivalent("\\dfrac{2}{4}", "\\frac12")
    assert equivalent("2\\sqrt{2}", "\\sqrt{8}")
    assert not equivalent("\\sqrt{2}", "2")
    assert not equivalent(None, "2")
