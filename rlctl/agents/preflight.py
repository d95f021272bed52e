"""What a run with ``agent.openai_agent`` checks before any worker starts: the agent file loads, the
``openai`` package is there, and the model's chat template splices episodes exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlctl.agents.chat import check_template
from rlctl.agents.loader import load_agent_function
from rlctl.errors import UserError


def check_openai_agent(spec: str, base_dir: str | Path, tokenizer: Any, where: str) -> None:
    """UserError naming ``where`` when the agent, the client package or the template cannot run."""
    load_agent_function(spec, base_dir)
    verdict = check_template(tokenizer)
    if not verdict.ok:
        raise UserError(
            f"{where}: the model's chat template cannot be spliced token-exactly across requests "
            f"({verdict.problems[0]}); `rlctl check-template MODEL` shows every problem"
        )
    try:
        import openai  # noqa: F401
    except ImportError:
        raise UserError(
            f"{where}: the agent's client is the openai package, which is not installed: "
            "pip install 'rlctl[agent]'"
        ) from None
