"""The ``[agent]`` section of a profile: multi-turn episodes played by an environment or by the
user's own OpenAI-client agent (:mod:`rlctl.agents`)."""

from __future__ import annotations

from dataclasses import dataclass

from rlctl.profile.fields import field


@dataclass(frozen=True)
class AgentSection:
    env: str = field(
        "",
        "Multi-turn environment: builtin:calculator or 'path/to/file.py:ClassName' (an "
        "rlctl.agents.Environment); empty = single-turn rollout. Like reward.function, code a profile runs.",
    )
    max_turns: int = field(
        4, "Model turns per episode; rollout.max_new_tokens bounds model + tool tokens together.", ge=1
    )
    max_turn_tokens: int = field(0, "Most tokens one model turn may sample (0 = only the budget).", ge=0)
    openai_agent: str = field(
        "",
        "Your own agent, 'path/to/file.py[:run]' with 'async def run(client, row)': it runs per episode "
        "with an openai.AsyncOpenAI client on this rollout's loopback endpoint and returns the reward "
        "(None: the profile's reward scores the model's tokens). Instead of env; needs the openai package.",
    )
    reward: str = field(
        "agent",
        "openai_agent: how its return value rewards the episode. 'agent': a number or bool is the "
        "reward, a string is the final answer that [reward] scores against the row's ground truth, "
        "None leaves [reward] to score the model's tokens. 'sum': [reward] scores every episode (the "
        "returned answer, else the model's tokens) and the agent's number is added; the agent may "
        "return an (answer, number) pair.",
        choices=("agent", "sum"),
    )
    gather_s: float = field(
        0.0,
        "openai_agent: a batch goes to the engine when every running episode has a request waiting "
        "(0: always so; batches and samples then depend on the seed alone), or after this many "
        "seconds with no new request (an agent busy in a slow tool does not hold the others up).",
        ge=0,
    )

    @property
    def episodic(self) -> bool:
        """Multi-turn rollout: an environment or an OpenAI-client agent plays each episode."""
        return bool(self.env or self.openai_agent)
