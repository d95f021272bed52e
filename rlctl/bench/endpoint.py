"""``rlctl bench endpoint``: the agent endpoint's batching against serving one request at a time.

Both sides run the same OpenAI-client agents (``episodes`` of ``turns`` requests each, every one
through the loopback HTTP server and the real ``openai`` client) on the same HF engine and model;
the batched side gathers concurrent requests into one ``generate`` (:mod:`rlctl.agents.batcher`),
the serial side calls ``generate`` once per request. Each side also checks its trajectories: every
episode ran all its turns with no prefix mismatch.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass
class EndpointBenchConfig:
    model: str | None = None  # a local HF model dir; None: the built-in tiny-1m model
    episodes: int = 64
    turns: int = 4
    answer_tokens: int = 32
    repeats: int = 3
    seed: int = 0


async def _agent(client: Any, row: dict[str, Any]) -> float:
    msgs = [{"role": "user", "content": f"q{row['i']}"}]
    for turn in range(row["turns"]):
        reply = await client.chat.completions.create(model="m", messages=msgs, max_tokens=row["tokens"])
        msgs += [
            {"role": "assistant", "content": reply.choices[0].message.content or ""},
            {"role": "user", "content": f"t{turn}"},
        ]
    return 1.0


def _model_dir(cfg: EndpointBenchConfig, tmp: str) -> str:
    if cfg.model:
        return cfg.model
    from rlctl.models import build_tiny_model

    return str(build_tiny_model("tiny-1m", Path(tmp) / "tiny-1m", seed=cfg.seed))


def _side(engine: Any, tok: Any, cfg: EndpointBenchConfig, max_batch: int) -> dict[str, Any]:
    from rlctl.agents.endpoint import EndpointRollout

    rows = [
        {"prompt": [], "i": i, "turns": cfg.turns, "tokens": cfg.answer_tokens} for i in range(cfg.episodes)
    ]
    ids = torch.full((len(rows), 8), tok.pad_token_id)
    mask = torch.zeros_like(ids)
    budget = cfg.turns * (cfg.answer_tokens + 16) + 16
    run = EndpointRollout(
        engine.generate, tok, _agent, rows, ids, mask,
        max_turns=[cfg.turns] * len(rows), max_tokens=budget, max_turn_tokens=0,
        eos_token_id=[tok.eos_token_id], pad_token_id=tok.pad_token_id, seed=cfg.seed,
        sampling={"temperature": 1.0}, max_batch=max_batch,
    )  # fmt: skip
    start = time.perf_counter()
    batch = run.run()
    seconds = time.perf_counter() - start
    complete = bool((batch["agent_turns"] == cfg.turns).all()) and not bool(
        batch["agent_prefix_mismatch"].any()
    )
    return {
        "seconds": seconds,
        "engine_calls": run.batcher.batches if max_batch == 0 else run.batcher.rows,
        "sampled_tokens": int(batch["response_mask"].sum()),
        "complete_and_exact": complete,
    }


def run_endpoint_bench(cfg: EndpointBenchConfig) -> dict[str, Any]:
    """Median seconds per side over ``repeats``; ``ratio`` is serial seconds / batched seconds."""
    from transformers import AutoTokenizer

    from rlctl.engines.hf_rollout import HFRolloutEngine

    with tempfile.TemporaryDirectory() as tmp:
        path = _model_dir(cfg, tmp)
        tok = AutoTokenizer.from_pretrained(path)
        engine = HFRolloutEngine(path)
        sides: dict[str, list[dict[str, Any]]] = {"batched": [], "serial": []}
        for _ in range(cfg.repeats):  # interleaved, so both sides see the same host load
            sides["batched"].append(_side(engine, tok, cfg, max_batch=0))
            sides["serial"].append(_side(engine, tok, cfg, max_batch=1))
    requests = cfg.episodes * cfg.turns
    out: dict[str, Any] = {"config": asdict(cfg), "requests": requests}
    for name, runs in sides.items():
        med = statistics.median(r["seconds"] for r in runs)
        out[name] = {
            "seconds": [r["seconds"] for r in runs],
            "median_s": med,
            "requests_per_s": requests / med,
            "engine_calls": runs[0]["engine_calls"],
            "complete_and_exact": all(r["complete_and_exact"] for r in runs),
        }
    out["ratio"] = out["serial"]["median_s"] / out["batched"]["median_s"]
    return out
