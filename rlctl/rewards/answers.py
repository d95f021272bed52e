"""Final answers of math responses: what a response commits to, and whether it equals the ground truth.

A response restates numbers and expressions from its prompt ("the number 23+45 is ..."), so a
scorer must compare only the answer the response commits to, never search the whole text for
something that evaluates to the ground truth. ``final_answer`` picks, in order: the last
``\\boxed{...}`` (or ``\\fbox{...}``), the rest of the line after the last ``####``, the last
number. ``equivalent`` compares two answers: plain numbers exactly (any size, commas and
trailing zeros ignored), anything else by value with math-verify. An unevaluated sum,
difference or product of plain numbers ("23+45") is not a final answer and never matches, nor
does a contradictory one: struck-out content (``\\cancel{4} 3``) or a relation whose plain-number
sides disagree (``4 = 3``; ``x = 3`` is fine). An answer sympy would take seconds or gigabytes to
evaluate (a power tower ``9^{9^{9}}``, an exponent past 10^4, a factorial of 1000 or more) is
compared as text only, and raises ``OverLimit`` when the text differs.

Digits are ASCII only: Arabic-Indic or full-width digits are not read as numbers (verl's
GSM8K pattern and math-verify do not read them either).
"""

from __future__ import annotations

import logging
import re
import threading

from rlctl.rewards.limits import OverLimit

# One plain number: optional sign, digits (thousands commas allowed), optional decimal part. The
# sign counts only where it cannot be a binary minus ("3-4" is 3 and 4, not 3 and -4).
_NUM = r"(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?|\.[0-9]+"
_NUMBER = re.compile(rf"(?:(?<![0-9A-Za-z)\]}}])-)?(?:{_NUM})")
_PLAIN = re.compile(rf"([-+]?)({_NUM})\.?(?:\s*[A-Za-z]{{2,}}(?:\s+[A-Za-z]{{2,}})*)?\.?")
_OPERATOR = r"(?:[-+*×·]|\\times|\\cdot|\\ast)"
_ARITHMETIC = re.compile(rf"-?(?:{_NUM})(?:\s*{_OPERATOR}\s*-?(?:{_NUM}))+")
_WRAPPERS = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_NOISE = ("\\$", "$", "\\,", "\\!", "\\;", "\\:", "\\ ", "\\left", "\\right", "\\displaystyle")
# Longest non-numeric answer handed to math-verify: MATH's longest answer is about 160 characters;
# a longer "answer" is a rambling response, and sympy can take seconds on it.
MAX_ANSWER_CHARS = 1000
_STRUCK = re.compile(r"\\(?:cancel|bcancel|xcancel|cancelto|sout|st|not)\b")
_RELATION = re.compile(r"(?<![<>!:=\\])=(?!=)")
_TOWER = re.compile(r"(?:\^|\*\*)\s*(?:\{[^{}]*(?:\^|\*\*)|(?:[0-9]+|[A-Za-z])\s*(?:\^|\*\*))")
_BIG_EXPONENT = re.compile(r"(?:\^|\*\*)\s*\{?\s*\(?\s*([0-9]{5,})")
_BIG_FACTORIAL = re.compile(r"[0-9]{4,}\s*!")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}``/``\\fbox{...}`` (nested braces), or ``\\boxed X`` up to ``$``.

    None when there is no box or the last one never closes.
    """
    idx = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if idx < 0:
        return None
    rest = text[idx + (6 if text.startswith("\\boxed", idx) else 5) :]
    if rest.startswith(" "):  # \boxed 5 (TeX's unbraced argument), as hendrycks MATH writes some
        return rest.split("$", 1)[0].split("\n", 1)[0].strip()
    rest = rest.lstrip()
    if not rest.startswith("{"):
        return None
    depth, i = 0, 0
    while i < len(rest):
        ch = rest[i]
        if ch == "\\":  # \{ and \} are literal braces, not grouping
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return rest[1:i].strip()
        i += 1
    return None


def after_hashes(text: str) -> str | None:
    """The rest of the line after the last ``####`` (GSM8K's answer marker), or None."""
    idx = text.rfind("####")
    if idx < 0:
        return None
    answer = text[idx + 4 :].split("\n", 1)[0].strip()
    return answer or None


def last_number(text: str) -> str | None:
    """The last plain number written in ``text`` (as written: sign, commas, decimals), or None."""
    found = _NUMBER.findall(text.replace("\u2212", "-"))
    return found[-1] if found else None


def final_answer(text: str) -> str | None:
    """The answer a response commits to: last box, else after the last ``####``, else the last number."""
    if "\\boxed" in text or "\\fbox" in text:
        return last_boxed(text)
    hashed = after_hashes(text)
    if hashed is not None:
        return hashed
    return last_number(text)


def ground_truth_answer(ground_truth: object) -> str:
    """The answer in a ground-truth field: its box or ``####`` answer when it has one, else the text."""
    text = str(ground_truth).strip()
    if "\\boxed" in text or "\\fbox" in text:
        text = last_boxed(text) or text
    elif "####" in text:
        text = after_hashes(text) or text
    return text


def _clean(answer: str) -> str:
    answer = answer.replace("\u2212", "-").replace("{,}", ",")
    for _ in range(3):  # \text{\textbf{5}}
        answer = _WRAPPERS.sub(r"\1", answer)
    for noise in _NOISE:
        answer = answer.replace(noise, "" if noise != "\\ " else " ")
    answer = answer.strip()
    if answer.startswith("\\(") and answer.endswith("\\)"):
        answer = answer[2:-2].strip()
    return answer


def canonical_number(answer: str) -> str | None:
    """``answer`` as a canonical decimal string when it is one plain number (units words allowed), else None.

    ``"1,234.50 apples"`` -> ``"1234.5"``; ``"-0.0"`` -> ``"0"``; ``"7+5"``, ``"1/2"`` -> None.
    """
    match = _PLAIN.fullmatch(_clean(answer))
    if match is None:
        return None
    sign, digits = match.group(1), match.group(2).replace(",", "")
    whole, _, frac = digits.partition(".")
    whole, frac = whole.lstrip("0") or "0", frac.rstrip("0")
    number = f"{whole}.{frac}" if frac else whole
    return number if number == "0" or sign != "-" else "-" + number


def is_unevaluated_arithmetic(answer: str) -> bool:
    """True for a sum, difference or product of plain numbers ("23+45", "7 \\times 5"): a question, not an answer."""
    return _ARITHMETIC.fullmatch(_clean(answer)) is not None


def contradictory(pred: str, gold: str) -> bool:
    """Struck-out content, or a relation whose plain-number sides disagree (with each other or the gold)."""
    cleaned = _clean(pred)
    if _STRUCK.search(cleaned):
        return True
    sides = [s.strip() for s in _RELATION.split(cleaned)]
    if len(sides) < 2:
        return False
    numbers = {n for n in (canonical_number(s) for s in sides) if n is not None}
    want = canonical_number(gold)
    return len(numbers) > 1 or (want is not None and bool(numbers) and numbers != {want})


def costly(expr: str) -> bool:
    """An expression sympy would take seconds or gigabytes on: a power tower, a huge exponent or factorial."""
    return bool(_TOWER.search(expr) or _BIG_EXPONENT.search(expr) or _BIG_FACTORIAL.search(expr))


def equivalent(pred: str | None, gold: str) -> bool:
    """Whether the final answer ``pred`` equals the ground-truth answer ``gold``.

    Plain numbers compare exactly; otherwise math-verify compares the two by value (``0.5`` equals
    ``\\frac{1}{2}``). math-verify bounds its own work with SIGALRM, which only the main thread
    may use: in a scorer process (where the RewardManager runs math rewards) that is where it
    runs; in any other thread its timeouts are off and the caller must bound the time.
    """
    if pred is None or not pred.strip() or is_unevaluated_arithmetic(pred) or contradictory(pred, gold):
        return False
    got, want = canonical_number(pred), canonical_number(gold)
    if got is not None and want is not None:
        return got == want
    pred, gold = _clean(pred), _clean(gold)
    if not pred or not gold or len(pred) > MAX_ANSWER_CHARS:
        return False
    if costly(pred) or costly(gold):
        if pred == gold:
            return True
        raise OverLimit(f"answer too costly to evaluate: {pred[:60]!r}")
    from math_verify import parse, verify

    main = threading.current_thread() is threading.main_thread()
    t = 5 if main else None
    if not main:  # math-verify warns once that its timeout is off; the RewardManager bounds it
        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).setLevel(logging.ERROR)
    parsed_gold = parse(f"\\boxed{{{gold}}}", parsing_timeout=t)
    parsed_pred = parse(f"\\boxed{{{pred}}}", parsing_timeout=t)
    if not parsed_gold or not parsed_pred:
        return False
    return bool(verify(parsed_gold, parsed_pred, timeout_seconds=t))
