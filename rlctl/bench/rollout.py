"""``rlctl bench rollout``: HF rollout engine tokens/s against raw ``model.generate``.

Both sides run on the same model object, batch, prompt length, number of new tokens and sampling
settings, in one process, alternating (engine, generate, engine, ...) so drift in machine load hits
both. EOS is disabled on both sides so every row generates exactly ``new_tokens`` tokens; tokens/s
counts generated tokens (batch * new_tokens) over wall time of the whole call, prefill included
(and, for the engine, the copy of its outputs to the host that every training step pays).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rlctl.devices import runtime_of
from rlctl.engines.hf_model import resolve_dtype


@dataclass(frozen=True)
class RolloutBenchConfig:
    """What to measure; ``model=None`` builds a random Qwen2 of the given size locally."""

    model: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    batch: int = 8
    prompt_len: int = 32
    new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repeats: int = 5
    warmup: int = 1
    seed: int = 0
    hidden_size: int = 256
    layers: int = 2
    vocab_size: int = 4096


def build_random_model(path: Path, cfg: RolloutBenchConfig) -> Path:
    """A random Qwen2 causal LM (no EOS in its generation config) saved to ``path``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(cfg.seed)
    heads = max(1, cfg.hidden_size // 64)
    config = Qwen2Config(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.hidden_size * 3,
        num_hidden_layers=cfg.layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=max(512, cfg.prompt_len + cfg.new_tokens),
        pad_token_id=0,
        eos_token_id=None,
        bos_token_id=None,
    )
    Qwen2ForCausalLM(config).save_pretrained(str(path))
    return path


def _prompts(cfg: RolloutBenchConfig, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts whose lengths vary between half and all of ``prompt_len``."""
    g = torch.Generator().manual_seed(cfg.seed)
    ids = torch.randint(1, vocab, (cfg.batch, cfg.prompt_len), generator=g)
    mask = torch.ones_like(ids)
    for i in range(cfg.batch):
        pad = (i * cfg.prompt_len // 2) // max(1, cfg.batch)
        ids[i, :pad] = 0
        mask[i, :pad] = 0
    return ids, mask


def _sync(device: torch.device) -> None:
    runtime_of(device).synchronize()


def run_rollout_bench(cfg: RolloutBenchConfig) -> dict:
    """Measure both sides; returns tokens/s of each, the ratio engine/generate and the config."""
    from rlctl.engines.hf_model import load_causal_lm
    from rlctl.engines.hf_rollout import HFRolloutEngine

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(cfg.model) if cfg.model else build_random_model(Path(tmp) / "model", cfg)
        model = load_causal_lm(path, dtype=resolve_dtype(cfg.dtype))
    engine = HFRolloutEngine(model, device=cfg.device)
    model = engine.model
    device = torch.device(cfg.device)
    ids, mask = _prompts(cfg, model.config.vocab_size)
    ids, mask = ids.to(device), mask.to(device)

    def run_engine() -> None:
        engine.generate(
            ids,
            mask,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            max_new_tokens=cfg.new_tokens,
            eos_token_id=None,
            pad_token_id=0,
            seed=cfg.seed,
        )

    def run_generate() -> None:
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                top_k=cfg.top_k,
                max_new_tokens=cfg.new_tokens,
                min_new_tokens=cfg.new_tokens,
                pad_token_id=0,
            )
        assert out.shape[1] == cfg.prompt_len + cfg.new_tokens

    sides = {"engine": run_engine, "generate": run_generate}
    times: dict[str, list[float]] = {k: [] for k in sides}
    for i in range(cfg.warmup + cfg.repeats):
        for name, fn in sides.items():
            _sync(device)
            start = time.perf_counter()
            fn()
            _sync(device)
            if i >= cfg.warmup:
                times[name].append(time.perf_counter() - start)
    tokens = cfg.batch * cfg.new_tokens
    rate = {k: tokens / statistics.median(v) for k, v in times.items()}
    return {
        "engine_tokens_per_s": rate["engine"],
        "generate_tokens_per_s": rate["generate"],
        "ratio": rate["engine"] / rate["generate"],
        "engine_seconds": times["engine"],
        "generate_seconds": times["generate"],
        "tokens_per_call": tokens,
        "threads": torch.get_num_threads(),
        "config": asdict(cfg),
    }
