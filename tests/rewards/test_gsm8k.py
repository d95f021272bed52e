"""GSM8K reward: parity with verl's scorer (verl/utils/reward_score/gsm8k.py) and its properties.

Each parity case's expected value is what verl's own ``compute_score`` returns for it (checked
against verl's file at commit b178a3c, including 20,000 generated cases for both modes).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.rewards.gsm8k import compute_score, extract_answer, gsm8k_score

STRICT = [
    ("Natalia sold 48/2 = 24 clips.\n#### 72", "72", 1.0),
    ("#### 1,234", "1234", 1.0),  # commas removed in strict mode
    ("#### -5", "-5", 1.0),
    ("#### 5\nActually\n#### 72", "72", 1.0),  # the last marker counts
    ("#### 72 and then some text", "72", 1.0),
    ("#### 72.", "72", 0.0),  # "72." is not "72": a wrong answer (format_score)
    ("#### 72.0", "72", 0.0),
    ("####72", "72", 0.0),  # exactly one space after ####
    ("#### $72", "72", 0.0),  # the number must follow the space
    ("The answer is 72", "72", 0.0),  # no marker: no answer
    ("#### ٧٢", "72", 0.0),  # Arabic-Indic digits are not digits here
    ("#### 72" + " filler" * 50, "72", 0.0),  # the marker is outside the last 300 characters
    ("reasoning " * 200 + "#### 72", "72", 1.0),
    ("", "72", 0.0),
]

FLEXIBLE = [
    ("The answer is 72", "72", 1.0),
    ("7 + 5 = 12", "12", 1.0),
    ("12 apples.", "12", 1.0),  # a trailing lone "." is skipped
    ("#### 72", "72", 1.0),
    ("1,234", "1234", 0.0),  # commas are kept in flexible mode
    ("pages 3-4", "4", 0.0),  # "-4"
    ("23 + 45 is the question; 60", "68", 0.0),
]


@pytest.mark.parametrize(("text", "gt", "want"), STRICT)
def test_strict_matches_verl(text, gt, want):
    assert compute_score(text, gt) == want
    assert gsm8k_score("openai/gsm8k", text, gt) == want


@pytest.mark.parametrize(("text", "gt", "want"), FLEXIBLE)
def test_flexible_matches_verl(text, gt, want):
    assert compute_score(text, gt, method="flexible") == want


@pytest.mark.parametrize(
    ("text", "method", "want"),
    [
        ("#### 71", "strict", 0.1),  # an answer, wrong: format score
        ("no marker 72", "strict", 0.0),  # no answer: 0, not the format score
        ("no digits at all", "flexible", 0.0),
        ("Hello, world.", "flexible", 0.1),  # verl reads "," as the last candidate
        ("...", "flexible", 0.1),  # all candidates are "."-like: verl keeps the first
        ("#### 72", "strict", 1.0),
    ],
)
def test_format_score_as_verl(text, method, want):
    assert compute_score(text, "72", method=method, format_score=0.1) == want


def test_extract_answer():
    assert extract_answer("#### 1,234,567") == "1234567"
    assert extract_answer("a 1,234 b", "flexible") == "1,234"
    assert extract_answer(". .", "flexible") == "."
    assert extract_answer("no", "flexible") is None
    with pytest.raises(ValueError, match="gsm8k method 'loose' unknown"):
        extract_answer("#### 1", "loose")


def test_integer_ground_truth_is_compared_as_text():
    assert compute_score("#### 72", 72) == 1.0


_prose = st.text(alphabet=st.characters(blacklist_characters="#"), max_size=200)


@settings(max_examples=150, deadline=None)
@given(prefix=_prose, n=st.integers(-(10**30), 10**30), commas=st.booleans())
def test_strict_reads_the_marked_answer_after_any_text(prefix, n, commas):
    written = f"{n:,}" if commas else str(n)
    assert compute_score(f"{prefix}\n#### {written}", str(n)) == 1.0
    assert compute_score(f"{prefix}\n#### {written}", str(n + 1), format_score=0.5) == 0.5


@settings(max_examples=150, deadline=None)
@given(text=_prose, gt=st.integers(-1000, 1000).map(str))
def test_strict_without_marker_is_zero_whatever_the_text(text, gt):
    assert compute_score(text, gt, format_score=0.5) == 0.0


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=400), gt=st.text(max_size=5), method=st.sampled_from(["strict", "flexible"]))
def test_score_is_always_one_of_three_values(text, gt, method):
    assert compute_score(text, gt, method=method, format_score=0.25) in (0.0, 0.25, 1.0)
