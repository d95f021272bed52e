"""Supervised warm-up (``rlctl sft``) with the same FSDP2 training engine the RL loop uses.

Each example is cut into the engine's batch convention (left-padded prompt, right-padded answer)
so the loss is the token-mean negative log-likelihood of the answer tokens under the same
log-prob code that RL trains with.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from rlctl.algorithms import agg_loss
from rlctl.algorithms.metric_parts import mean_of
from rlctl.data import SFTDataset, load_dataset
from rlctl.data.batcher import left_pad
from rlctl.engines.fsdp_train import FSDPTrainEngine
from rlctl.engines.hf_rollout import HFRolloutEngine
from rlctl.engines.optim import LossScale, OptimConfig
from rlctl.errors import UserError
from rlctl.log import get_logger
from rlctl.profile.schema import Profile
from rlctl.tracking import Tracker
from rlctl.tracking.run_files import atomic_dir
from rlctl.trainer.plan.choices import single_process_engines
from rlctl.trainer.setup.evaluate import greedy_accuracy, scorer_for
from rlctl.trainer.setup.models import load_tokenizer, materialize_model, stop_token_ids
from rlctl.trainer.setup.prompts import load_prompts

log = get_logger("rlctl.sft")


def to_engine_batch(items: list[dict[str, list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """SFT items (ids + loss mask) -> prompt left-padded + answer right-padded, as RL batches are."""
    prompts, answers = [], []
    for it in items:
        cut = it["loss_mask"].index(1)
        prompts.append(it["input_ids"][:cut])
        answers.append(it["input_ids"][cut:])
    p_ids, p_mask, _ = left_pad(prompts, pad_id)
    width = max(len(a) for a in answers)
    r_ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    r_mask = torch.zeros((len(items), width), dtype=torch.long)
    for i, a in enumerate(answers):
        r_ids[i, : len(a)] = torch.tensor(a)
        r_mask[i, : len(a)] = 1
    attn = torch.cat([p_mask, r_mask], 1)
    return {
        "input_ids": torch.cat([p_ids, r_ids], 1),
        "attention_mask": attn,
        "position_ids": (attn.cumsum(1) - 1).clamp(min=0),
        "responses": r_ids,
        "response_mask": r_mask,
    }


def nll_loss(out: dict[str, torch.Tensor], mb: dict[str, torch.Tensor], scale: LossScale):
    """Token-mean negative log-likelihood of the answer tokens (exact under micro-batching)."""
    mask = mb["response_mask"]
    loss = -agg_loss(
        out["log_probs"], mask, "token-mean", global_tokens=scale.global_tokens, dp_size=scale.dp_size
    )
    return loss, {"nll": mean_of(-out["log_probs"], mask)}  # the batch's token mean


def run_sft(profile: Profile, run_dir: Path) -> dict[str, Any]:
    """Train, validate every ``sft.eval_every`` steps, stop at ``sft.stop_at_accuracy``, export HF."""
    s = profile.sft
    if profile.actor.lora is not None:
        raise UserError(
            f"{profile.source}: actor.lora: LoRA applies to RL training (rlctl train); rlctl sft trains "
            "all weights: remove the [actor.lora] table"
        )
    torch.manual_seed(profile.run.seed)
    model_path = materialize_model(profile.model.path, run_dir / "base_model", seed=profile.run.seed)
    profile = replace(profile, model=replace(profile.model, path=model_path))
    tokenizer = load_tokenizer(model_path, profile.model.trust_remote_code)
    stops = stop_token_ids(model_path, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    data = SFTDataset(load_dataset(profile.data.train, "train", seed=profile.run.seed), tokenizer)
    _, val = load_prompts(profile, tokenizer)
    scorer = scorer_for(profile, tokenizer)
    device, dtype = single_process_engines(profile)
    engine = FSDPTrainEngine(
        model_path,
        device=device,
        dtype="float32",  # fp32 master weights; compute in the platform's dtype
        mixed_precision=None if dtype == "float32" else dtype,
        micro_batch_size=s.batch_sequences,
        optim=OptimConfig(
            lr=s.lr, warmup_steps=s.warmup_steps, weight_decay=0.0, grad_clip=1.0, warmup_from_zero=False
        ),  # the warmup the shipped SFT checkpoints were made with
        trust_remote_code=profile.model.trust_remote_code,
    )
    rollout = HFRolloutEngine(
        model_path, device=device, dtype=dtype, trust_remote_code=profile.model.trust_remote_code
    )
    tracker = Tracker(run_dir, profile.trainer.loggers, profile.run.name, {}, s.steps, resume=False)
    result: dict[str, Any] = {}
    epoch, stream, step, start = 0, iter(()), 0, time.perf_counter()
    try:
        while step < s.steps:
            batch = next(stream, None)
            if batch is None:
                order = torch.randperm(
                    len(data), generator=torch.Generator().manual_seed(profile.run.seed + epoch)
                )
                stream = (
                    to_engine_batch([data[int(j)] for j in order[i : i + s.batch_sequences]], pad)
                    for i in range(0, len(order) - s.batch_sequences + 1, s.batch_sequences)
                )
                epoch += 1
                continue
            step += 1
            metrics = engine.train_batch(batch, nll_loss, with_entropy=False)
            metrics = {f"sft/{k}": v for k, v in metrics.items()} | {
                "train_time_s": time.perf_counter() - start
            }
            if val is not None and (step == s.steps or (s.eval_every and step % s.eval_every == 0)):
                rollout.update_weights(engine.export_weights("full"))  # in memory, as in RL
                if profile.agent.episodic:  # multi-turn: greedy episodes scored by the environment
                    from rlctl.agents.evaluate import episode_accuracy

                    acc = episode_accuracy(rollout, tokenizer, val, profile, model_path, scorer=scorer)
                else:
                    acc = greedy_accuracy(
                        rollout, tokenizer, val, scorer, profile.rollout.max_new_tokens, stops
                    )
                metrics["val/accuracy"] = acc.get("accuracy", acc["score_mean"])
                result = {"step": step, "val/accuracy": metrics["val/accuracy"]}
                log.info("sft validation", step=step, accuracy=round(metrics["val/accuracy"], 4))
                tracker.log(metrics, step=step)
                if s.stop_at_accuracy and metrics["val/accuracy"] >= s.stop_at_accuracy:
                    break
            else:
                tracker.log(metrics, step=step)
    finally:
        tracker.close()
    export = Path(s.export_to) if s.export_to else run_dir / "hf"
    with atomic_dir(export) as tmp:  # a full disk leaves the previous export or none, never half of one
        engine.save_hf(tmp, tokenizer)
    log.info("sft model exported", path=str(export), **result)
    return result | {"export": str(export)}
