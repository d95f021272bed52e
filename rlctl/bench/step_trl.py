"""TRL's GRPOTrainer as a row of ``rlctl bench step`` (optional ``bench`` extra, ``trl==1.16.0``):
the GRPOConfig settings that mirror the profile, each stated, and the run measured as rlctl's are."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any

from rlctl.bench.step_common import StepBenchConfig, bench_profile, summarise


def trl_settings(profile) -> dict[str, Any]:
    """GRPOConfig keyword arguments mirroring the profile (trl 1.16.0, trl/trainer/grpo_config.py):
    one generation of prompts x n completions per optimiser step, GRPO group-std advantages,
    token-mean loss ("dapo": normalised by the batch's active tokens), no KL, constant lr."""
    p = profile
    return {
        "per_device_train_batch_size": p.sequences_per_step,
        "gradient_accumulation_steps": 1,
        "num_generations": p.rollout.n,
        "max_completion_length": p.rollout.max_new_tokens,
        "temperature": p.rollout.temperature,
        "top_p": p.rollout.top_p,
        "top_k": p.rollout.top_k,
        "learning_rate": p.actor.lr,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "weight_decay": p.actor.weight_decay,
        "max_grad_norm": p.actor.grad_clip,
        "beta": 0.0,
        "epsilon": p.actor.clip_ratio_low,
        "epsilon_high": p.actor.clip_ratio_high,
        "num_iterations": p.actor.ppo_epochs,
        "scale_rewards": "group" if p.algorithm.norm_adv_by_std else "none",
        "loss_type": "dapo",
        "max_steps": p.trainer.steps,
        "seed": p.run.seed,
        "use_cpu": True,
        "bf16": False,
        "report_to": [],
        "save_strategy": "no",
        "logging_steps": 10**9,
        "disable_tqdm": True,
        "log_completions": False,
        "dataloader_num_workers": 0,
    }


def run_trl(cfg: StepBenchConfig, out: Path, params: int, peak: float) -> dict[str, Any]:
    """TRL's GRPOTrainer on the same checkpoint, rows, template, reward and shape; evaluation runs
    in a callback off the clock, through rlctl's own validation path (HF rollout engine, greedy,
    the same scorer)."""
    import copy

    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlctl.data import load_dataset
    from rlctl.dispatch import DataProto
    from rlctl.engines.hf_model import load_causal_lm
    from rlctl.engines.hf_rollout import HFRolloutEngine
    from rlctl.trainer.setup.evaluate import scorer_for
    from rlctl.trainer.setup.models import load_tokenizer, materialize_model, stop_token_ids
    from rlctl.trainer.setup.prompts import load_prompts

    profile = bench_profile(cfg, "sync", out)
    model_path = materialize_model(profile.model.path, out / "trl-base", seed=profile.run.seed)
    tokenizer = load_tokenizer(profile.model.tokenizer or model_path, profile.model.trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    scorer = scorer_for(profile, tokenizer)
    _, val = load_prompts(profile, tokenizer)
    stops = stop_token_ids(model_path, tokenizer)
    rows = load_dataset(profile.data.train, "train", seed=profile.run.seed)
    data = Dataset.from_list(
        [
            {
                "prompt": r["prompt"],
                "ground_truth": r["reward_model"]["ground_truth"],
                "source": r["data_source"],
            }
            for r in rows
        ]
    )

    def exact_answer(prompts, completions, ground_truth, source, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return list(scorer.manager.score(list(source), texts, list(ground_truth)).scores)

    def evaluate(model) -> float:
        engine = HFRolloutEngine(copy.deepcopy(model).cpu())
        out_ = engine.generate(
            val.batch["input_ids"],
            val.batch["attention_mask"],
            max_new_tokens=profile.rollout.max_new_tokens,
            greedy=True,
            eos_token_id=stops,
            pad_token_id=tokenizer.pad_token_id,
        )
        batch = DataProto.from_dict(tensors=out_, non_tensors=val.non_tensor)
        scored, _ = scorer.score(batch, shaping=False)
        return scored.batch["acc"].float().mean().item()

    clock = {"step_s": [], "curve": [], "tokens": []}

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kw):
            clock["curve"].append((0.0, evaluate(model)))

        def on_step_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **kw):
            clock["step_s"].append(time.perf_counter() - self.start)
            s = state.global_step
            if s % profile.trainer.val_every == 0 or s == args.max_steps:
                clock["curve"].append((sum(clock["step_s"]), evaluate(model)))

    settings = trl_settings(profile)
    model = load_causal_lm(model_path, dtype="float32")
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=exact_answer,
        args=GRPOConfig(output_dir=str(out / "trl"), **settings),
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    with contextlib.redirect_stdout(sys.stderr):  # TRL prints its summary; stdout carries --json
        trainer.train()
    # tokens per step: prompts + completions, measured on the validation prompts' lengths (same task)
    mean_prompt = float(val.batch["attention_mask"].sum(-1).float().mean())
    tokens = profile.sequences_per_step * (mean_prompt + profile.rollout.max_new_tokens)
    row = summarise(
        "trl",
        clock["step_s"],
        clock["curve"],
        sequences=profile.sequences_per_step,
        tokens=[tokens],
        passes=1 + 3,
        params=params,
        peak_gflops=peak,
        target=cfg.target,
    )
    row["settings"] = {k: v for k, v in settings.items() if k not in ("report_to",)}
    return row
