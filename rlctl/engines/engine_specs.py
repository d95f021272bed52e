"""What the driver hands an engine about its optimiser and its LoRA adapter: plain frozen
dataclasses without torch, so the plan (and doctor, which resolves one) builds them without
importing torch. The engines' code that acts on them lives in :mod:`.optim` and :mod:`.lora`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OptimConfig:
    """AdamW + warmup then constant or cosine decay to ``min_lr_ratio * lr``; ``grad_clip<=0`` disables.

    ``warmup_steps`` and ``total_steps`` are in the unit of whoever steps the schedule. The RL
    trainer steps it once per RL step, as verl does (``total_steps = trainer.steps``), so warmup
    and decay land on the same RL steps whatever the number of mini-batches, epochs or ranks;
    supervised fine-tuning steps it once per optimiser step. ``warmup_from_zero`` is verl's warmup
    (the first step at LR 0); rlctl's SFT keeps the one its shipped checkpoints were made with,
    ``(s + 1) / warmup_steps``, so its recipes still reproduce them bit for bit.
    """

    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = 0
    total_steps: int = 0
    schedule: str = "constant"
    min_lr_ratio: float = 0.0
    grad_clip: float = 1.0
    warmup_from_zero: bool = True

    def __post_init__(self) -> None:
        if self.schedule not in ("constant", "cosine"):
            raise ValueError(f"optim.schedule must be 'constant' or 'cosine', got {self.schedule!r}")
        if self.schedule == "cosine" and self.total_steps <= 0:
            raise ValueError("optim.total_steps must be > 0 for the cosine schedule")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")


@dataclass(frozen=True)
class LoraSpec:
    """What ``[actor.lora]`` asks for (profile-independent, picklable)."""

    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("all-linear",)
    modules_to_save: tuple[str, ...] = ()
    export_merged: bool = False
    seed: int = 0  # of the adapter's initial values

    def peft_config(self, base_model_path: str | None = None):
        """The ``peft.LoraConfig`` of this spec (``all-linear`` passed as peft's string form)."""
        from peft import LoraConfig

        targets = "all-linear" if list(self.target_modules) == ["all-linear"] else list(self.target_modules)
        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=targets,
            modules_to_save=list(self.modules_to_save) or None,
            bias="none",
            task_type="CAUSAL_LM",
            base_model_name_or_path=base_model_path,
        )
