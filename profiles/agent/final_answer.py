"""SFT-time check of the calculator task: 1 when the final answer is the product.

``rlctl sft`` validates single-turn, so its validation rows (``calculator-sft-val.jsonl``) hold the
episode up to the tool's result (user question, the model's call, the result) and this scores the
model's next turn: the answer read off the tool.
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str.strip() == str(ground_truth).strip())
