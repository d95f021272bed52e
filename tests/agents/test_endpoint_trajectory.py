"""Token-exact trajectories without an engine: a tool call and a stop string the model 'sampled' are
rendered back as written when the agent sends the message again, so the next request extends the
episode's ids exactly (no client package needed)."""

from __future__ import annotations

from rlctl.agents.answers import make_answer
from rlctl.agents.chat import normalise, render, renders_tool_role
from rlctl.agents.trajectory import EpisodeTrace


def test_tool_calls_sent_back_render_as_the_model_wrote_them(char_model):
    """No engine: the answer the model 'sampled' is a Hermes tool call; the agent sends back the
    OpenAI-format message and a tool result; the next rendering extends the chain exactly."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(char_model))
    trace = EpisodeTrace(prompt_width=64)
    encode = lambda t: tok(t, add_special_tokens=False)["input_ids"]  # noqa: E731
    tools = [{"type": "function", "function": {"name": "mul", "parameters": {"type": "object"}}}]
    msgs = [{"role": "user", "content": "12*3="}]
    role = renders_tool_role(tok)
    ctx = trace.context(render(tok, normalise(msgs, tool_role=role), tools), encode)
    sampled = encode('<tool_call>{"name":"mul","arguments":{"a":12,"b":3}}</tool_call>') + [tok.eos_token_id]
    ans = make_answer(tok, sampled, [-0.5] * len(sampled), stops=[], eos={tok.eos_token_id}, parse_tools=True)
    assert ans.choice.finish_reason == "tool_calls" and ans.choice.content is None
    call = ans.choice.tool_calls[0]
    assert call["function"] == {"name": "mul", "arguments": '{"a": 12, "b": 3}'}
    trace.record(ctx.extended(ans.ids, tok.decode(ans.ids), True, ans.log_probs), first=True)
    trace.raw_by_call[call["id"]] = ans.raw
    msgs += [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "36"},
    ]
    nxt = trace.context(
        render(tok, normalise(msgs, tool_role=role, sampled_text=trace.sampled_text), tools), encode
    )
    assert trace.mismatches == 0
    assert nxt.ids[: len(ctx.ids) + len(sampled)] == ctx.ids + sampled  # the sampled ids, untouched
    assert tok.decode(nxt.ids[len(ctx.ids) + len(sampled) :]) == "<|user|>36<|assistant|>"


def test_a_stop_string_ends_the_answer_and_is_rendered_back_as_sampled(char_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(char_model))
    encode = lambda t: tok(t, add_special_tokens=False)["input_ids"]  # noqa: E731
    sampled = encode("abcSTOPxyz")
    ans = make_answer(
        tok, sampled, [-1.0] * len(sampled), stops=["STOP"], eos={tok.eos_token_id}, parse_tools=False
    )
    assert ans.choice.content == "abc" and ans.choice.finish_reason == "stop"
    assert ans.ids == encode("abcSTOP") and ans.raw == "abcSTOP"  # tokens after the stop are not kept
    trace = EpisodeTrace(prompt_width=64)
    msgs = [{"role": "user", "content": "q"}]
    ctx = trace.context(render(tok, msgs, None), encode)
    trace.record(ctx.extended(ans.ids, tok.decode(ans.ids), True, ans.log_probs), first=True)
    trace.raw_by_content[ans.choice.content] = ans.raw
    msgs += [{"role": "assistant", "content": "abc"}, {"role": "user", "content": "next"}]
    nxt = trace.context(
        render(tok, normalise(msgs, tool_role=False, sampled_text=trace.sampled_text), None), encode
    )
    assert trace.mismatches == 0 and nxt.ids[: len(ctx.ids) + len(ans.ids)] == ctx.ids + ans.ids
