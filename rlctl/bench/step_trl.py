"""TRL's GRPOTrainer as a row of ``rlctl bench step`` (optional ``bench`` extra, ``trl==1.16.0``):
the GRPOConfig settings that mirror the profile, each stated, and the run measured as rlctl's are,
its step split into generation (+ scoring) and update."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any

from rlctl.bench.step_common import StepBenchConfig, bench_profile, host_matmul_gflops, summarise
from rlctl.errors import RunError


def trl_settings(profile) -> dict[str, Any]:
    """GRPOConfig keyword arguments mirroring the profile (trl 1.16.0, trl/trainer/grpo_config.py):
    one generation of prompts x n completions per optimiser step, GRPO group-std advantages,
    token-mean loss ("dapo": normalised by the batch's active tokens), no KL, constant lr,
    activation checkpointing as the profile's actor has it."""
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
        # GRPOConfig turns it on by default (grpo_config.py: "Defaults to True instead of False"):
        # the profile's choice instead, so both sides run the same backward
        "gradient_checkpointing": p.actor.activation_checkpointing,
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


def run_trl(cfg: StepBenchConfig, out: Path, params: int, seed_index: int = 0) -> dict[str, Any]:
    """TRL's GRPOTrainer on the same checkpoint, rows, template, reward and shape (``run.seed`` =
    the profile's + ``seed_index``, GRPOConfig's seed the same); evaluation runs in a callback off
    the clock, through rlctl's own validation path (HF rollout engine, greedy, the same scorer).
    Rows are chat messages, which TRL renders with the tokenizer's chat template and the
    generation prompt, as rlctl does; completions reach the reward as assistant messages."""
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

    profile = bench_profile(cfg, "sync", out, seed_index)
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

    def profile_reward(prompts, completions, ground_truth, source, **_):
        """The profile's scorer (``reward.kind``) on the completions' text."""
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

    clock = {"step_s": [], "curve": []}

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
        reward_funcs=profile_reward,
        args=GRPOConfig(output_dir=str(out / f"trl-seed{profile.run.seed}"), **settings),
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    gen = time_generation(trainer)
    peak = host_matmul_gflops()  # right before the run, as rlctl's runs
    with contextlib.redirect_stdout(sys.stderr):  # TRL prints its summary; stdout carries --json
        trainer.train()
    if len(gen["seconds"]) != len(clock["step_s"]):
        raise RunError(
            f"TRL generated {len(gen['seconds'])} times in {len(clock['step_s'])} steps; expected once a step"
        )
    row = summarise(
        "trl",
        clock["step_s"],
        clock["curve"],
        sequences=profile.sequences_per_step,
        tokens=gen["tokens"],
        passes=1 + 3,
        params=params,
        peak_gflops=peak,
        target=cfg.target,
        stages={
            "gen": gen["seconds"],
            "update_actor": [s - g for s, g in zip(clock["step_s"], gen["seconds"], strict=True)],
        },
    )
    row["settings"] = {k: v for k, v in settings.items() if k not in ("report_to",)}
    return row


def time_generation(trainer) -> dict[str, list[float]]:
    """Wrap the trainer's generate-and-score method (trl 1.16.0,
    trl/trainer/grpo_trainer.py: ``GRPOTrainer._generate_and_score_completions``, called by
    ``_prepare_inputs`` once per ``steps_per_generation * num_iterations`` steps, here every step)
    on this instance: its seconds, and the real tokens it returns (``prompt_mask`` +
    ``completion_mask``: prompts without their left padding, completions up to their EOS)."""
    method = trainer._generate_and_score_completions
    record: dict[str, list[float]] = {"seconds": [], "tokens": []}

    def timed(inputs):
        start = time.perf_counter()
        output = method(inputs)
        record["seconds"].append(time.perf_counter() - start)
        record["tokens"].append(float(output["prompt_mask"].sum() + output["completion_mask"].sum()))
        return output

    trainer._generate_and_score_completions = timed
    return record
