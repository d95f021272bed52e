"""reward.kind = "verl": verl's default scorer chosen by each row's data_source.

Parity cases are verl's own results (verl/utils/reward_score at commit b178a3c) on inputs where
verl's string normalisation and rlctl's value comparison agree; the cases where they differ are
listed separately (rlctl accepts equal values that verl's string match misses).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.errors import UserError
from rlctl.profile import load_profile
from rlctl.rewards import build_reward_manager
from rlctl.rewards.verl import check_sources, dapo_score, math_score, scorer_for_source, verl_score

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("source", "text", "gt", "want"),
    [
        ("openai/gsm8k", "so 48 + 24 = 72\n#### 72", "72", 1.0),
        ("openai/gsm8k", "so 48 + 24 = 72", "72", 0.0),  # strict: no marker, no answer
        ("openai/gsm8k", "#### 1,234", "1234", 1.0),
        ("lighteval/MATH", "So $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}", 1.0),
        ("DigitalLearningGmbH/MATH-lighteval", "\\boxed{\\dfrac12}", "\\frac{1}{2}", 1.0),
        ("HuggingFaceH4/MATH-500", "\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("lighteval/MATH", "\\boxed{5} then \\boxed{6}", "6", 1.0),
        ("lighteval/MATH", "\\boxed{5} then \\boxed{6}", "5", 0.0),
        ("lighteval/MATH", "\\boxed{x=5}", "5", 1.0),
        ("lighteval/MATH", "\\boxed{10^\\circ}", "10", 1.0),
        ("lighteval/MATH", "\\boxed{1/2}", "\\frac{1}{2}", 1.0),
        (
            "lighteval/MATH",
            "\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}",
            "\\left( 3, \\frac{\\pi}{2} \\right)",
            1.0,
        ),
        ("lighteval/MATH", "the answer is 5", "5", 0.0),  # MATH needs a box
        ("lighteval/MATH", "\\boxed{23+45}", "68", 0.0),
        ("lighteval/MATH", "\\boxed{5", "5", 0.0),
        ("lighteval/MATH", "\\boxed{}", "5", 0.0),
    ],
)
def test_scores_match_verl(source, text, gt, want):
    assert verl_score(source, text, gt) == want


@pytest.mark.parametrize(
    ("text", "gt", "score", "pred"),
    [
        ("Answer: 42", "42", 1.0, "42"),
        ("Answer: 41\nAnswer: 42", "42", 1.0, "42"),  # the last Answer: line
        ("Answer: 42 dollars", "42", 1.0, "42 dollars"),
        ("Answer: \\frac{1}{2}", "\\frac12", 1.0, "\\frac{1}{2}"),
        ("Answer: 1,000", "1000", 1.0, "1,000"),
        ("Answer: x = 3", "3", 1.0, "x = 3"),
        ("x" * 400 + "Answer: 3", "3", 1.0, "3"),
        ("Answer: 3" + "x" * 400, "3", -1.0, "[INVALID]"),  # outside the last 300 characters
        ("\\boxed{42}", "42", -1.0, "[INVALID]"),  # DAPO reads "Answer:", not boxes
        ("no answer", "42", -1.0, "[INVALID]"),
    ],
)
def test_dapo_matches_verl(text, gt, score, pred):
    for source in ("math_dapo", "math", "math_dapo_reasoning", "aime2024"):
        got = verl_score(source, text, gt)
        assert got == {"score": score, "acc": float(score > 0), "pred": pred}


@pytest.mark.parametrize(
    ("fn", "text", "gt"),
    [
        (math_score, "\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),  # verl's string match: 0
        (math_score, "\\fbox{5}", "5"),  # verl: its box remover rejects \fbox, 0
        (dapo_score, "Answer: 0.5", "\\frac{1}{2}"),  # verl: -1
        (dapo_score, "answer: 42.", "42"),  # verl: "42." is not "42", -1
    ],
)
def test_equal_values_verl_misses_are_accepted(fn, text, gt):
    got = fn("s", text, gt)
    assert (got["score"] if isinstance(got, dict) else got) == 1.0


def test_gsm8k_options_reach_the_scorer():
    assert verl_score("openai/gsm8k", "it is 72", "72", gsm8k_method="flexible") == 1.0
    assert verl_score("openai/gsm8k", "#### 71", "72", format_score=0.1) == 0.1


def test_builtin_sources_mix_with_verl_ones():
    assert verl_score("rlctl/addition", "46", "46") == 1.0


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("gsm8k", "no scorer for data_source 'gsm8k'"),
        ("openai/GSM8K", "no scorer for data_source 'openai/GSM8K'"),
        ("", "no scorer for data_source ''"),
        ("numina_olympiads", "verl's prime_math, which rlctl does not ship"),
        ("codecontests", "use reward.kind = 'code'"),
        ("hiyouga/geometry3k", "verl's geo3k"),
        ("searchR1_nq", "search_r1_like_qa_em"),
    ],
)
def test_unknown_or_unshipped_sources_fail_naming_the_source(source, needle):
    with pytest.raises(UserError, match="reward.kind = 'verl'") as err:
        scorer_for_source(source)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_check_sources_names_the_first_bad_one():
    check_sources(["openai/gsm8k", "lighteval/MATH", "aime25", "rlctl/addition"])
    with pytest.raises(UserError, match="'my/data'"):
        check_sources(["openai/gsm8k", "my/data", "openai/gsm8k"])


@pytest.mark.timeout(120)
def test_manager_scores_a_mixed_verl_batch_in_scorer_processes():
    mgr = build_reward_manager("verl", num_workers=1)
    try:
        out = mgr.score(
            ["openai/gsm8k", "openai/gsm8k", "lighteval/MATH", "math_dapo", "rlctl/addition"],
            ["#### 72", "The number 23+45 is a classic example", "\\boxed{\\frac{2}{4}}", "Answer: 7", "46"],
            ["72", "68", "\\frac12", "8", "46"],
        )
        assert out.scores == [1.0, 0.0, 1.0, -1.0, 1.0]
        assert out.acc == [1.0, 0.0, 1.0, 0.0, 1.0]
        assert out.extra["pred"] == [None, None, None, "7", None]
        assert out.metrics["reward/errors"] == 0.0
        # one unknown source stops the pass before anything is scored, even far under max_error_rate
        with pytest.raises(UserError, match="no scorer for data_source 'my/custom-set'"):
            mgr.score(["openai/gsm8k"] * 99 + ["my/custom-set"], ["#### 1"] * 100, ["1"] * 100)
    finally:
        mgr.close()


def test_manager_refuses_an_unknown_gsm8k_method():
    with pytest.raises(UserError, match="reward.gsm8k_method = 'loose'"):
        build_reward_manager("verl", gsm8k_method="loose")


def test_profile_selects_verl_rewards(tmp_path):
    (tmp_path / "p.toml").write_text(
        '[model]\npath = "m"\n[reward]\nkind = "verl"\ngsm8k_method = "flexible"\nformat_score = 0.1\n'
    )
    prof = load_profile(tmp_path / "p.toml")
    assert (prof.reward.kind, prof.reward.gsm8k_method, prof.reward.format_score) == ("verl", "flexible", 0.1)
    (tmp_path / "bad.toml").write_text(
        '[model]\npath = "m"\n[reward]\nkind = "verl"\ngsm8k_method = "loose"\n'
    )
    with pytest.raises(UserError, match="gsm8k_method"):
        load_profile(tmp_path / "bad.toml")
