"""Built-in verifiable tasks: ``addition``, ``reverse``, ``sort``, ``countdown``, ``longtail``
(long-tailed answer lengths), and the multi-turn
``guess`` (higher/lower feedback) and ``calculator`` (a tool call) for :mod:`rlctl.agents`.

``get_task(name, **options)`` builds one; ``task_for_source(data_source)`` finds the verifier of a
row by its ``data_source`` (``rlctl/<name>``); verification needs only the ground truth.
"""

from __future__ import annotations

from typing import Any

from rlctl.data.tasks.arithmetic import AdditionTask, ReverseTask, SortTask
from rlctl.data.tasks.base import SPLITS, Task, strip_answer
from rlctl.data.tasks.calculator import CalculatorTask
from rlctl.data.tasks.countdown import CountdownTask, evaluate_countdown, verify_countdown
from rlctl.data.tasks.guess import GuessTask
from rlctl.data.tasks.longtail import LongTailTask
from rlctl.errors import UserError

TASKS: dict[str, type[Task]] = {
    "addition": AdditionTask,
    "reverse": ReverseTask,
    "sort": SortTask,
    "countdown": CountdownTask,
    "longtail": LongTailTask,
    "guess": GuessTask,
    "calculator": CalculatorTask,
}


def get_task(name: str, **options: Any) -> Task:
    """A built-in task by name; unknown names or options are a UserError naming them."""
    if name not in TASKS:
        raise UserError(f"unknown built-in task {name!r}; expected one of: {', '.join(sorted(TASKS))}")
    try:
        return TASKS[name](**options)
    except (TypeError, ValueError) as exc:
        raise UserError(f"built-in task {name!r}: bad options {options}: {exc}") from None


def task_for_source(data_source: str) -> Task | None:
    """The built-in task whose rows carry ``data_source`` (e.g. ``rlctl/addition``), else None."""
    prefix = "rlctl/"
    if data_source.startswith(prefix) and data_source[len(prefix) :] in TASKS:
        return TASKS[data_source[len(prefix) :]]()
    return None


__all__ = [
    "SPLITS",
    "TASKS",
    "AdditionTask",
    "CalculatorTask",
    "CountdownTask",
    "GuessTask",
    "LongTailTask",
    "ReverseTask",
    "SortTask",
    "Task",
    "evaluate_countdown",
    "get_task",
    "strip_answer",
    "task_for_source",
    "verify_countdown",
]
