"""Countdown: reach a target with the given numbers, each used exactly once, and + - * /.

Format: user message "make 16 from 3 5 2=" -> answer an arithmetic expression that uses
exactly the given numbers, e.g. "(3+5)*2", then EOS. An optional trailing "=16" is allowed. Ground truth is ``{"target": int, "numbers": [int, ...]}``. The verifier parses the
expression with ``ast`` (no eval), allows only integer literals, + - * / and parentheses, and
computes exactly with fractions, so 7/2*2 is 7 and division by zero scores 0.
"""

from __future__ import annotations

import ast
import random
from collections import Counter
from fractions import Fraction
from typing import Any

from rlctl.data.tasks.base import Task, strip_answer

MAX_EXPRESSION_CHARS = 200
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def _evaluate(node: ast.AST, used: list[int]) -> Fraction:
    """Exact value of an allowed expression tree; collects the integer literals in ``used``."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, used)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _evaluate(node.left, used), _evaluate(node.right, used)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if right == 0:
            raise ZeroDivisionError("division by zero")
        return left / right
    raise ValueError(f"not allowed in a countdown answer: {type(node).__name__}")


def evaluate_countdown(expression: str) -> tuple[Fraction, list[int]]:
    """(exact value, integer literals used) of an expression; ValueError if it is not allowed."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError("expression too long")
    used: list[int] = []
    value = _evaluate(ast.parse(expression, mode="eval"), used)
    return value, used


def verify_countdown(solution_str: str, target: int, numbers: list[int]) -> float:
    """1.0 iff the expression uses exactly ``numbers`` (as a multiset) and equals ``target``."""
    text = strip_answer(solution_str)
    if "=" in text:
        text, _, rhs = text.partition("=")
        if rhs.strip() and rhs.strip() != str(target):
            return 0.0
    try:
        value, used = evaluate_countdown(text.strip())
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
        return 0.0
    return float(Counter(used) == Counter(int(n) for n in numbers) and value == target)


class CountdownTask(Task):
    """``count`` numbers in 1..``max_number``; the target is made from a random expression tree."""

    name = "countdown"
    val_fraction = 0.1

    def __init__(self, count: int = 3, max_number: int = 20, max_target: int = 200) -> None:
        if not 2 <= int(count) <= 6:
            raise ValueError(f"count must be in 2..6, got {count}")
        self.count, self.max_number, self.max_target = int(count), int(max_number), int(max_target)

    def sample(self, rng: random.Random) -> tuple[int, tuple[int, ...], str]:
        while True:
            numbers = [rng.randint(1, self.max_number) for _ in range(self.count)]
            items: list[tuple[str, Fraction]] = [(str(n), Fraction(n)) for n in numbers]
            while len(items) > 1:
                (ea, va), (eb, vb) = (
                    items.pop(rng.randrange(len(items))),
                    items.pop(rng.randrange(len(items))),
                )
                op = rng.choice("+-*/")
                if op == "/" and (vb == 0 or (va / vb).denominator != 1):
                    op = "+"
                if op == "-" and va < vb:
                    (ea, va), (eb, vb) = (eb, vb), (ea, va)
                value = {"+": va + vb, "-": va - vb, "*": va * vb, "/": va / vb if vb else va}[op]
                items.append((f"({ea}{op}{eb})", value))
            expr, value = items[0]
            if value.denominator == 1 and 1 <= value <= self.max_target:
                return int(value), tuple(numbers), ast.unparse(ast.parse(expr, mode="eval")).replace(" ", "")

    def key(self, problem: tuple[int, tuple[int, ...], str]) -> str:
        target, numbers, _ = problem
        return f"{target}:{','.join(map(str, sorted(numbers)))}"

    def row_parts(self, problem: tuple[int, tuple[int, ...], str]) -> tuple[str, Any, str, dict[str, Any]]:
        target, numbers, expr = problem
        content = f"make {target} from {' '.join(map(str, numbers))}="
        return content, {"target": target, "numbers": list(numbers)}, expr, {}

    def verify(self, solution_str: str, ground_truth: Any) -> float:
        return verify_countdown(solution_str, int(ground_truth["target"]), list(ground_truth["numbers"]))
