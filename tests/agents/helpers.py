"""A small random model with the built-in character tokenizer, and scripted environments."""

from __future__ import annotations

from pathlib import Path

import torch

from rlctl.agents import Environment, Step, Turn
from rlctl.models.tokenizer import CHAT_TEMPLATE, build_char_tokenizer

# Qwen3-like: the generation prompt opens an empty think block (enable_thinking=False), and
# earlier assistant turns are re-rendered with their think blocks stripped; tool results render
# as a user turn wrapped in <tool_response>, as Qwen's template does.
THINK_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}"
    "{{ '<|assistant|>' + (m['content'].split('</think>')[-1]) + '<|eos|>' }}"
    "{% elif m['role'] == 'tool' %}"
    "{{ '<|user|><tool_response>' + m['content'] + '</tool_response>' }}"
    "{% else %}{{ '<|' + m['role'] + '|>' + m['content'] }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|><think></think>' }}{% endif %}"
)


def make_char_model(path: Path, template: str = CHAT_TEMPLATE, seed: int = 0) -> Path:
    """Save a random 2-layer Qwen2 LM with the character tokenizer (``template`` as its chat template)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = build_char_tokenizer()
    tok.chat_template = template
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


class ScriptedEnv(Environment):
    """Done after ``extra_info["turns"]`` model turns; each earlier turn gets a tool message back."""

    def step(self, turn: Turn) -> Step:
        if turn.index + 1 >= int(self.row["extra_info"]["turns"]):
            return Step(done=True, reward=float(turn.index + 1))
        return Step(messages=[{"role": "tool", "content": f"obs{turn.index}"}])


def rows_with_turns(turns: list[int]) -> list[dict]:
    return [
        {
            "prompt": [{"role": "user", "content": f"q{i}"}],
            "ground_truth": "",
            "extra_info": {"turns": t},
            "tools_kwargs": {},
        }
        for i, t in enumerate(turns)
    ]


AGENTS = Path(__file__).resolve().parents[2] / "profiles" / "agent"


def load_agent(name: str):
    """The module of ``profiles/agent/<name>.py`` (an OpenAI-client agent file)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, AGENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def guess_games(model_dir: Path, count: int, **task):
    """``count`` held-out guess-the-number games for ``model_dir``: (tokenizer, rows, prompt ids,
    prompt mask, an HF rollout engine on the model)."""
    from transformers import AutoTokenizer

    from rlctl.data.batcher import left_pad
    from rlctl.data.dataset import encode_prompt
    from rlctl.data.tasks.guess import GuessTask
    from rlctl.engines.hf_rollout import HFRolloutEngine

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    rows = [
        {"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"], "extra_info": r["extra_info"]}
        for r in GuessTask(**task).rows("validation", count, seed=0)
    ]
    ids, mask, _ = left_pad([encode_prompt(tok, r["prompt"]) for r in rows], tok.pad_token_id)
    return tok, rows, ids, mask, HFRolloutEngine(model_dir)


def endpoint_rollout(games, agent, *, turns: int, budget: int, turn_tokens: int, seed: int, sampling: dict, **kw):
    """``agent`` playing ``games`` (from :func:`guess_games`) through the endpoint."""
    from rlctl.agents.endpoint import EndpointRollout

    tok, rows, ids, mask, engine = games
    return EndpointRollout(
        engine.generate,
        tok,
        agent,
        rows,
        ids,
        mask,
        max_turns=[turns] * len(rows),
        max_tokens=budget,
        max_turn_tokens=turn_tokens,
        eos_token_id=[tok.eos_token_id],
        pad_token_id=tok.pad_token_id,
        seed=seed,
        sampling=sampling,
        **kw,
    )
