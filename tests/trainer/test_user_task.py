"""A user's own task through the CLI only: verl-schema JSONL + a custom reward file, SFT then GRPO."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest

from tests.cli_runner import run_cli

REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """1 when the response is exactly the last digit of the number."""
    return 1.0 if solution_str.strip() == str(ground_truth) else 0.0
'''


def write_task(folder: Path, n: int, seed: int, name: str) -> Path:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        number = str(rng.randrange(100, 100000))
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"last {number}="}],
                "data_source": "user/last_digit",
                "reward_model": {"ground_truth": number[-1], "style": "rule"},
                "extra_info": {"answer": number[-1], "index": i},
            }
        )
    path = folder / name
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def val_accuracy(run_dir: Path) -> list[float]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x["val/accuracy"] for x in lines if "val/accuracy" in x]


@pytest.mark.timeout(900)
def test_user_jsonl_and_custom_reward_sft_then_grpo_learns(tmp_path, tiny_model):
    write_task(tmp_path, 2000, seed=1, name="train.jsonl")
    write_task(tmp_path, 64, seed=2, name="val.jsonl")
    (tmp_path / "reward.py").write_text(REWARD)
    common = """
[platform]
vendor = "cpu"
[cluster]
backend = "inprocess"
[data]
train = "train.jsonl"
val = "val.jsonl"
[reward]
kind = "custom"
function = "reward.py:compute_score"
[rollout]
max_new_tokens = 3
n = 4
"""
    (tmp_path / "sft.toml").write_text(
        f'[run]\nname = "sft"\noutput_dir = "{tmp_path}/runs"\n[model]\npath = "{tiny_model}"\n'
        + common
        + '[sft]\nsteps = 25\nbatch_sequences = 32\nlr = 3e-3\neval_every = 25\n[trainer]\nloggers = ["jsonl"]\n'
    )
    code, out, err = run_cli("sft", str(tmp_path / "sft.toml"), "--json")
    assert code == 0, err
    sft_acc = val_accuracy(tmp_path / "runs/sft")[-1]

    # Three seeds, the median's final accuracy: a 30-step curve on 64 prompts swings 15-25 points
    # between validations (seeds 1-6 ended at 0.47-0.92 from the same SFT start), so one seed's
    # last validation says more about its luck than about whether GRPO learns.
    finals = []
    for seed in (1, 2, 3):
        (tmp_path / f"grpo{seed}.toml").write_text(
            f'[run]\nname = "grpo{seed}"\nseed = {seed}\noutput_dir = "{tmp_path}/runs"\n'
            + f'[model]\npath = "{tmp_path}/runs/sft/hf"\n'
            + common
            + '[algorithm]\npreset = "grpo"\n[actor]\nlr = 3e-4\nuse_kl_loss = false\n'
            + '[trainer]\nsteps = 30\nprompts_per_step = 8\nval_every = 10\nsave_every = 0\nloggers = ["jsonl"]\n'
        )
        code, out, err = run_cli("train", str(tmp_path / f"grpo{seed}.toml"))
        assert code == 0, err
        accs = val_accuracy(tmp_path / f"runs/grpo{seed}")
        assert accs[0] == pytest.approx(sft_acc), "GRPO starts from the SFT export"
        finals.append(accs[-1])
    assert sft_acc < 0.8, "the warm-up is deliberately short: GRPO must do the rest"
    # GRPO, not the warm-up, improves held-out accuracy (measured: finals 0.47 / 0.92 / 0.67 from 0.55)
    median = statistics.median(finals)
    assert median >= sft_acc + 0.06, finals
    assert median >= 0.5, finals  # chance is 0.1
