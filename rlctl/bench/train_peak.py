"""One training step's measured peak memory on this CPU host against the plan's training peak.

``python -m rlctl.bench.train_peak MODEL_DIR --rows 4 16 --prompt 32 --response 32`` runs, for
each row count, a fresh child process that builds the FSDP2 training engine on ``MODEL_DIR``
(fp32, one rank, activation checkpointing off, micro-batches of ``rows`` sequences), runs two
optimiser steps of two micro-batches each (the second micro-batch runs beside the first one's
gradients, as in a run with several micro-batches a step) of a token-mean log-prob loss with the
entropy the update reports (AdamW's moments exist from the first step) and reports the resident-set peak of those steps above the process's
resident set before the engine was built, next to
:func:`rlctl.trainer.plan.memory.training_memory` for the same shape (weights, gradients,
optimiser state, activations, logits).

The child runs with ``MALLOC_MMAP_THRESHOLD_`` set (128 KiB), so every tensor of a useful size is
its own mapping and returns to the kernel when freed: the resident set then follows the live
tensors instead of glibc's retained heap (which adds about 1 GiB after an update, see
``docs/plan.md``). The peak is the kernel's VmHWM, reset (``/proc/self/clear_refs`` 5) once the
engine is built, so model loading does not count. Before the baseline the child runs one step of
a one-row batch and drops it: the code and pools the runtime loads at its first training step
stay resident (reported as ``runtime_warmup_gib``, a per-process cost the plan's training term
does not model).

``--build-qwen2 DIR --vocab 151936`` writes a small Qwen2-shaped model (random weights) with that
vocabulary, to measure the logits term at a 152k vocabulary without a real checkpoint.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

GIB = float(1 << 30)
MMAP_THRESHOLD = str(128 << 10)


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def build_qwen2(out: str, vocab: int) -> str:
    """A 2-layer Qwen2-shaped model (hidden 128, untied head) with ``vocab`` tokens, saved to ``out``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    Qwen2ForCausalLM(config).save_pretrained(out)
    return out


def _loss(outputs, mb, scale):
    """Token-mean ``-log p`` minus a small entropy bonus (both outputs get a gradient)."""
    mask = mb["response_mask"].float()
    loss = -((outputs["log_probs"] + 1e-3 * outputs["entropy"]) * mask).sum() / mask.sum()
    return loss, {"loss": float(loss.detach())}


def _batch(vocab: int, rows: int, prompt: int, response: int) -> dict:
    """``rows`` random sequences of ``prompt`` + ``response`` tokens in verl's batch layout."""
    import torch

    length = prompt + response
    ids = torch.randint(0, vocab, (rows, length))
    return {
        "input_ids": ids,
        "attention_mask": torch.ones(rows, length, dtype=torch.long),
        "position_ids": torch.arange(length).expand(rows, length).clone(),
        "responses": ids[:, prompt:].clone(),
        "response_mask": torch.ones(rows, response, dtype=torch.long),
    }


def child(model: str, rows: int, prompt: int, response: int) -> dict:
    """Measure in this process (run it in a fresh one): the peak above the pre-engine baseline."""
    import torch

    from rlctl.engines.fsdp_train import FSDPTrainEngine
    from rlctl.trainer.plan.memory import training_memory
    from rlctl.trainer.plan.shape import model_shape

    torch.manual_seed(0)
    shape = model_shape(model)
    start = _status_kib("VmRSS")
    # warm-up: one step of one 2-token row, then everything dropped; what stays resident is the
    # runtime's lazily loaded code and pools (optimizer, autograd), not a tensor the plan counts
    warm = FSDPTrainEngine(model, micro_batch_size=1, attn_implementation="sdpa")
    warm.train_batch(_batch(shape.vocab_size, 1, 1, 1), _loss, with_entropy=True)
    del warm
    gc.collect()
    base = _status_kib("VmRSS")
    engine = FSDPTrainEngine(model, micro_batch_size=rows, attn_implementation="sdpa")
    batch = _batch(shape.vocab_size, 2 * rows, prompt, response)  # two micro-batches a step
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS now
    for _ in range(2):
        engine.train_batch(batch, _loss, with_entropy=True)
    peak = (_status_kib("VmHWM") - base) * 1024
    length = prompt + response
    plan = training_memory(
        shape,
        world=1,
        compute_dtype="float32",
        batch_rows=2 * rows,
        micro_batch_sequences=rows,
        micro_batch_tokens=0,
        seq_len=length,
        response_len=response,
        checkpointing=False,
    )
    return {
        "model": model,
        "vocab": shape.vocab_size,
        "params": shape.params,
        "rows": rows,
        "prompt": prompt,
        "response": response,
        "runtime_warmup_gib": round((base - start) * 1024 / GIB, 3),
        "measured_gib": round(peak / GIB, 3),
        "planned_gib": round(plan.peak / GIB, 3),
        "planned_logits_gib": round(plan.logits / GIB, 3),
        "planned_activations_gib": round(plan.activations / GIB, 3),
        "ratio": round(plan.peak / peak, 3),
    }


def measure(model: str, rows: int, prompt: int, response: int) -> dict:
    """:func:`child` in a fresh process with the mmap threshold set (see the module docstring)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD}
    cmd = [sys.executable, "-m", "rlctl.bench.train_peak", model, "--child", str(rows), str(prompt), str(response)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m rlctl.bench.train_peak", description=__doc__.splitlines()[0])
    ap.add_argument("model", help="an HF model directory (or the output directory with --build-qwen2)")
    ap.add_argument("--rows", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--response", type=int, default=32)
    ap.add_argument("--build-qwen2", action="store_true", help="first write a Qwen2-shaped model there")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--child", nargs=3, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.model, *args.child)))
        return
    if args.build_qwen2:
        build_qwen2(args.model, args.vocab)
    for rows in args.rows:
        print(json.dumps(measure(args.model, rows, args.prompt, args.response)), flush=True)


if __name__ == "__main__":
    main()
