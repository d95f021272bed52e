"""Built-in tasks: verifiers (correct / wrong / malformed), split determinism and disjointness."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlctl.data.tasks import TASKS, get_task, task_for_source, verify_countdown
from rlctl.errors import UserError


def _keys(rows):
    return {r["prompt"][0]["content"] for r in rows}


# the multi-turn tasks (guess, calculator) hold warm-up traces, tested in tests/agents
SINGLE_TURN = sorted(
    n for n in TASKS if "agent_name" not in get_task(n).rows("validation", n=1)[0]["extra_info"]
)


@pytest.mark.parametrize("name", SINGLE_TURN)
def test_splits_are_disjoint_deterministic_and_seeded(name):
    task = get_task(name)
    train = task.rows("train", n=2000, seed=0)
    val = task.rows("validation", n=200, seed=0)
    assert len(train) == 2000 and len(val) == 200
    assert not _keys(train) & _keys(val)
    assert len(_keys(train)) == 2000  # no duplicate problems within a split
    assert task.rows("validation", n=200, seed=0) == val
    assert task.rows("validation", n=200, seed=1) != val
    assert task_for_source(val[0]["data_source"]).name == name


@pytest.mark.parametrize("name", SINGLE_TURN)
def test_reference_answers_verify_and_rows_follow_verl_schema(name):
    task = get_task(name)
    for row in task.rows("validation", n=100, seed=0):
        assert row["data_source"] == f"rlctl/{name}"
        assert row["reward_model"]["style"] == "rule"
        assert row["prompt"][0]["role"] == "user"
        truth = row["reward_model"]["ground_truth"]
        assert task.verify(row["extra_info"]["answer"], truth) == 1.0
        assert task.verify(row["extra_info"]["answer"] + "<|eos|>junk", truth) == 1.0
        assert task.verify("", truth) == 0.0
        assert task.verify("garbage ))(", truth) == 0.0


@given(st.integers(10, 99), st.integers(10, 99))
def test_two_digit_addition_prompt_and_answer_format(a, b):
    task = get_task("addition")
    assert (task.lo, task.hi) == (10, 99)
    row = task.row_parts((a, b))
    assert row[0] == f"{a}+{b}=" and row[1] == str(a + b)


def test_addition_verifier_is_exact():
    task = get_task("addition")
    assert task.verify("46", "46") == 1.0
    assert task.verify(" 46\n", "46") == 1.0
    assert task.verify("47", "46") == 0.0
    assert task.verify("046", "46") == 0.0
    assert task.verify("46 7", "46") == 0.0
    assert task.verify("the answer is 46", "46") == 0.0


def test_addition_answers_are_short():
    from rlctl.models import build_char_tokenizer

    tok = build_char_tokenizer()
    for row in get_task("addition").rows("validation", n=400):
        assert len(tok(row["extra_info"]["answer"], add_special_tokens=False)["input_ids"]) + 1 <= 8


def test_addition_digits_option_and_train_size_cap():
    three = get_task("addition", digits=3).rows("validation", n=5)
    assert all(len(r["prompt"][0]["content"]) == len("123+456=") for r in three)
    one = get_task("addition", digits=1)
    train, val = one.rows("train", n=1000), one.rows("validation", n=1000)
    assert len(train) + len(val) == 100 and not _keys(train) & _keys(val)


def test_reverse_and_sort():
    rev, srt = get_task("reverse"), get_task("sort", length=4)
    assert rev.row_parts("12345")[:2] == ("rev 12345=", "54321")
    assert srt.row_parts("3141")[:2] == ("sort 3141=", "1134")
    assert rev.verify("54321", "54321") == 1.0 and rev.verify("12345", "54321") == 0.0


@pytest.mark.parametrize(
    ("answer", "score"),
    [
        ("(3+5)*2", 1.0),
        ("2*(5+3)", 1.0),
        ("(3+5)*2=16", 1.0),
        ("(3+5)*2=17", 0.0),
        ("3*5+2", 0.0),  # wrong value
        ("(3+5)*2+0", 0.0),  # 0 is not one of the numbers
        ("(3+3)*2", 0.0),  # 3 used twice, 5 unused
        ("16", 0.0),  # numbers not used
        ("3/(5-5)*2", 0.0),  # division by zero
        ("__import__('os').system('true')", 0.0),
        ("(3+5)**2", 0.0),  # power is not allowed
        ("3.0*5+2", 0.0),
        ("(3+5)*2" + "+0" * 500, 0.0),  # too long
        ("((((3+5", 0.0),
    ],
)
def test_countdown_verifier(answer, score):
    assert verify_countdown(answer, 16, [3, 5, 2]) == score


def test_countdown_division_is_exact():
    assert verify_countdown("7/2*4", 14, [7, 2, 4]) == 1.0
    assert verify_countdown("7/2", 3, [7, 2]) == 0.0


def test_unknown_task_and_bad_options_are_user_errors():
    with pytest.raises(UserError, match="unknown built-in task 'nope'"):
        get_task("nope")
    with pytest.raises(UserError, match="digits"):
        get_task("addition", digits=0)
    with pytest.raises(UserError, match="bad options"):
        get_task("addition", colour="red")


def test_addition_question_style_and_operand_range_keep_the_split():
    task = get_task("addition", style="question", max_operand=19)
    rows = task.rows("validation", n=1000, seed=0)
    assert 30 <= len(rows) <= 50  # 400 problems, about a tenth held out
    a, b = rows[0]["extra_info"]["a"], rows[0]["extra_info"]["b"]
    assert rows[0]["prompt"][0]["content"] == f"What is {a} + {b}? Answer with only the number."
    assert all(0 <= r["extra_info"]["a"] <= 19 and 0 <= r["extra_info"]["b"] <= 19 for r in rows)
    # the same problems are held out whatever the prompt style
    compact = get_task("addition", max_operand=19).rows("validation", n=1000, seed=0)
    assert [r["reward_model"]["ground_truth"] for r in compact] == [
        r["reward_model"]["ground_truth"] for r in rows
    ]
    with pytest.raises(UserError, match="style"):
        get_task("addition", style="poem")


def test_longtail_answer_lengths_are_long_tailed():
    """The long-tail task's answers run from a few digits to max_len, most of them short: a batch's
    longest answer is several times its median (what partial rollouts and async generation gain on)."""
    task = get_task("longtail")
    rows = task.rows("train", n=2000, seed=0)
    lengths = sorted(len(r["reward_model"]["ground_truth"]) for r in rows)
    assert lengths[0] == 2 and lengths[-1] == 100
    median = lengths[len(lengths) // 2]
    assert 10 <= median <= 18  # log-uniform on 2..100: sqrt(2 * 101) ~ 14
    assert 0.12 < sum(n > 50 for n in lengths) / len(lengths) < 0.25
    assert rows[0]["prompt"][0]["content"] == f"echo {rows[0]['reward_model']['ground_truth']}="
    assert task.verify("0123", "0123") == 1.0 and task.verify("012", "0123") == 0.0


def test_longtail_options_are_checked():
    assert get_task("longtail", min_len=5, max_len=5).rows("train", n=3, seed=0)[0]["extra_info"]["length"] == 5
    with pytest.raises(UserError, match="longtail"):
        get_task("longtail", min_len=10, max_len=5)
