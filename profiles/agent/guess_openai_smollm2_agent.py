"""Guess-the-number written for a small pretrained chat model (SmolLM2-135M-Instruct), against the
OpenAI client only (no rlctl import).

The same game as guess_openai_agent.py (a secret in 0..hi, three guesses, higher/lower feedback),
with the choices an agent author makes for a model that answers in sentences:

- one worked example game before the real one (few-shot chat turns), so the model answers with a
  bare number from its first turn;
- the guess is the first integer of the reply ("The number is 5." guesses 5), with room for a
  short sentence (``MAX_TOKENS``);
- the feedback is a sentence the model reads as a request for another number ("Wrong: my number
  is lower than 5. Guess again."), not a bare "lower";
- a reply without a number loses the game; the reward is 1 for a won game, else 0.
"""

import re

TURNS = 3
MAX_TOKENS = 8
INTEGER = re.compile(r"-?\d+")
EXAMPLE = [
    {"role": "user", "content": "Pick a number between 0 and 9. Reply with just the digit."},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "Wrong: my number is higher than 4. Guess again."},
    {"role": "assistant", "content": "7"},
    {"role": "user", "content": "Correct! Next game."},
]


def first_integer(text):
    """The first integer written in ``text`` (None: there is none)."""
    found = INTEGER.search(text)
    return int(found.group()) if found else None


async def run(client, row):
    messages = EXAMPLE + [dict(m) for m in row["prompt"]]
    secret = int(row["ground_truth"])
    for _ in range(TURNS):
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=MAX_TOKENS)
        text = reply.choices[0].message.content or ""
        guess = first_integer(text)
        if guess is None:
            return 0.0
        if guess == secret:
            return 1.0
        side = "higher" if guess < secret else "lower"
        messages.append({"role": "assistant", "content": text})
        messages.append({"role": "user", "content": f"Wrong: my number is {side} than {guess}. Guess again."})
    return 0.0
