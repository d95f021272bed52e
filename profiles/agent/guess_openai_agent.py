"""Guess-the-number played by an agent written only against the OpenAI client (no rlctl import).

rlctl runs ``run(client, row)`` once per episode with an ``openai.AsyncOpenAI`` client pointed at
the rollout's endpoint (profiles/agent-guess-openai.toml); the same code runs against any
OpenAI-compatible server. The row is the data row: ``prompt`` (chat messages) and
``ground_truth`` (the secret). The return value is the episode's reward.
"""

TURNS = 3


async def run(client, row):
    messages = [dict(m) for m in row["prompt"]]
    secret = int(row["ground_truth"])
    for _ in range(TURNS):
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
        text = reply.choices[0].message.content or ""
        guess = text.strip()
        if not guess.isdigit():
            return 0.0
        if int(guess) == secret:
            return 1.0
        messages.append({"role": "assistant", "content": text})
        messages.append({"role": "user", "content": "higher" if int(guess) < secret else "lower"})
    return 0.0
