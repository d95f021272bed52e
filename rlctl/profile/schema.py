"""The typed Profile: one flat dataclass per section, defaults for everything a small run omits.

Batch sizes are named by what they count: ``trainer.prompts_per_step`` prompts are sampled per
step and each gets ``rollout.n`` responses, so a step trains on prompts_per_step * n sequences.
Mini-batches count prompts (``actor.mini_batch_prompts``), micro-batches count sequences
(``actor.micro_batch_sequences``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlctl.profile.fields import field
from rlctl.profile.schema_agent import AgentSection
from rlctl.profile.schema_lora import LoraSection

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_KINDS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k1+", "k2+", "k3+", "low_var_kl+", "abs+")
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class RunSection:
    name: str = field("rlctl-run", "Run name; the run directory is output_dir/name.")
    seed: int = field(1, "Seed for data order, sampling and initialisation.", ge=0)
    output_dir: str = field("runs", "Parent directory of run directories (relative to the working dir).")


@dataclass(frozen=True)
class PlatformSection:
    vendor: str = field("auto", "auto, cpu, nvidia, rocm, ascend, or an installed plugin's name.")
    attention: str = field("auto", "Attention kernel; auto picks the platform's best available.")
    dtype: str = field(
        "auto",
        "Compute dtype; auto is float32 on CPU, else bfloat16 where the devices support it, else "
        "float16. Trained models keep fp32 master weights and optimizer state.",
        choices=DTYPES,
    )
    cpu_threads: int = field(
        0,
        "Torch threads per rank on CPU. 0 (auto): the rank's share of the host's cores (half "
        "of it each for the trainer and the rollout processes of the off-policy modes); n: n "
        "threads per rank, as given.",
        ge=0,
    )


@dataclass(frozen=True)
class ClusterSection:
    backend: str = field(
        "ray", "Worker runtime: ray, or inprocess (one process).", choices=("ray", "inprocess")
    )
    address: str = field("local", "Ray address: local (start one), auto, or ray://host:port.")
    nodes: int = field(1, "Number of nodes.", ge=1)
    devices_per_node: int = field(1, "Workers (devices) per node.", ge=1)
    call_timeout_s: float = field(900.0, "Seconds a worker call may take before the run fails.", gt=0)


@dataclass(frozen=True)
class ModelSection:
    path: str = field(
        "", "Local HF model directory, or builtin:tiny-1m / builtin:tiny-10m (built locally).", path=True
    )
    tokenizer: str = field("", "Tokenizer directory; empty means model.path.", path=True)
    trust_remote_code: bool = field(False, "Allow the model's own Python code to run (off unless asked).")


@dataclass(frozen=True)
class DataSection:
    train: str = field(
        "builtin:addition", "Train prompts: builtin:TASK, or a .jsonl/.parquet file.", path=True
    )
    val: str = field("", "Validation prompts; empty uses the task's validation split.", path=True)
    val_size: int = field(400, "Validation prompts evaluated each time (0 = all).", ge=0)
    max_prompt_length: int = field(64, "Prompts longer than this many tokens are dropped.", ge=1)
    shuffle: bool = field(True, "Shuffle the train prompts each epoch.")


@dataclass(frozen=True)
class AlgorithmSection:
    preset: str = field("", "Named preset applied beneath this profile (grpo, dr_grpo, dapo, ppo, ...).")
    adv_estimator: str = field("grpo", "Advantage estimator (gae, grpo, rloo, reinforce_plus_plus, ...).")
    norm_adv_by_std: bool = field(True, "GRPO: divide by the group std (false = Dr.GRPO).")
    gamma: float = field(1.0, "Discount factor.", ge=0, le=1)
    lam: float = field(1.0, "GAE lambda.", ge=0, le=1)
    use_kl_in_reward: bool = field(False, "Subtract a KL penalty from the rewards.")
    kl_penalty: str = field("kl", "KL estimator for the in-reward penalty.", choices=KL_KINDS)
    kl_ctrl: str = field("fixed", "In-reward KL coefficient controller.", choices=("fixed", "adaptive"))
    kl_coef: float = field(0.001, "In-reward KL coefficient (initial value when adaptive).", ge=0)
    kl_target: float = field(0.1, "Adaptive KL controller target.", gt=0)
    kl_horizon: int = field(10000, "Adaptive KL controller horizon.", ge=1)
    dynamic_sampling: bool = field(
        False, "DAPO: keep only groups whose dynamic_sampling_metric varies, resample to fill the batch."
    )
    dynamic_sampling_metric: str = field(
        "acc",
        "DAPO: what a group must vary in (verl's filter_groups.metric): acc (the scorer's accuracy, "
        "else its score), score (the scorer's score), seq_reward (score with overlong shaping).",
        choices=("acc", "score", "seq_reward"),
    )
    max_sampling_rounds: int = field(3, "DAPO: generation rounds allowed to fill one batch.", ge=1)
    overlong_buffer: int = field(0, "DAPO overlong shaping: penalty ramp length in tokens (0 = off).", ge=0)
    overlong_penalty: float = field(1.0, "DAPO overlong shaping: maximum penalty.", ge=0)
    rollout_correction: str = field(
        "off", "Importance correction with rollout log-probs.", choices=("off", "token", "sequence")
    )
    rollout_correction_mode: str = field("truncate", "truncate or mask.", choices=("truncate", "mask"))
    rollout_correction_threshold: float = field(2.0, "Upper importance-weight threshold.", gt=0)


@dataclass(frozen=True)
class ActorSection:
    lr: float = field(1e-6, "Learning rate.", gt=0)
    weight_decay: float = field(0.0, "AdamW weight decay.", ge=0)
    warmup_steps: int = field(
        0, "Linear warmup, in RL steps (the schedule advances once per step, as verl's).", ge=0
    )
    lr_schedule: str = field("constant", "Schedule after warmup.", choices=("constant", "cosine"))
    grad_clip: float = field(1.0, "Gradient norm clip (0 = off).", ge=0)
    ppo_epochs: int = field(1, "Passes over each step's batch.", ge=1)
    mini_batch_prompts: int = field(0, "Prompts per optimiser step (0 = the whole step's batch).", ge=0)
    micro_batch_sequences: int = field(16, "Sequences per forward/backward (gradient accumulation).", ge=1)
    micro_batch_tokens: int = field(
        0,
        "Token budget per forward/backward instead of a sequence count: as many sequences as fit in "
        "it at the batch's padded width (verl's dynamic batch size). 0 = use micro_batch_sequences.",
        ge=0,
    )
    policy_loss: str = field("vanilla", "Policy loss (vanilla, gspo, cispo, gpg).")
    clip_ratio_low: float = field(0.2, "PPO clip below 1.", ge=0)
    clip_ratio_high: float = field(0.2, "PPO clip above 1 (DAPO clip-higher: larger).", ge=0)
    clip_ratio_c: float = field(3.0, "Dual-clip bound for negative advantages.", gt=1)
    loss_agg_mode: str = field("token-mean", "Loss aggregation.", choices=LOSS_AGG_MODES)
    entropy_coeff: float = field(0.0, "Entropy bonus coefficient.", ge=0)
    use_kl_loss: bool = field(False, "Add a KL-to-reference term to the loss (GRPO style).")
    kl_loss_coef: float = field(0.001, "KL loss coefficient.", ge=0)
    kl_loss_type: str = field("low_var_kl", "KL estimator for the loss.", choices=KL_KINDS)
    activation_checkpointing: bool = field(False, "Recompute activations in backward.")
    skip_zero_advantage: bool = field(
        True,
        "Leave out of the update's backward the sequences whose advantage is 0 at every token (a "
        "GRPO/RLOO group whose responses all scored the same): with a policy loss registered as "
        "advantage-linear (the built-ins), no entropy bonus and no KL loss they add exactly nothing "
        "to the gradient, and they still count in the loss's normalisation, so the update is the "
        "same. They run one forward without grad so that actor/pg_loss, actor/entropy and the other "
        "loss metrics stay the whole batch's. actor/zero_grad_row_frac is their share of the "
        "sequences with loss tokens.",
    )
    param_offload: bool = field(False, "Offload parameters to CPU between stages (accelerators).")
    optimizer_offload: bool = field(False, "Offload optimizer state to CPU between stages (accelerators).")
    lora: LoraSection | None = field(
        None, "LoRA instead of full fine-tuning: the [actor.lora] table (keys below); absent = off."
    )


@dataclass(frozen=True)
class RolloutSection:
    engine: str = field(
        "auto",
        "Rollout engine; auto is the platform's (vllm, then sglang on accelerators; hf on CPU). "
        "On an accelerator hf runs only when asked for.",
        choices=("auto", "hf", "vllm", "sglang"),
    )
    n: int = field(8, "Responses sampled per prompt.", ge=1)
    temperature: float = field(1.0, "Sampling temperature.", gt=0)
    top_p: float = field(1.0, "Nucleus sampling mass.", gt=0, le=1)
    top_k: int = field(0, "Top-k sampling (0 = off).", ge=0)
    max_new_tokens: int = field(64, "Maximum response length in tokens.", ge=1)
    tensor_parallel: int = field(
        1,
        "Rollout tensor-parallel degree: each rollout replica splits the model over this many "
        "ranks (sync mode; HF and vLLM engines, SGLang with each replica inside one node).",
        ge=1,
    )
    gpu_memory_utilization: float = field(
        0.5, "vLLM/SGLang memory fraction (the HF engine reads none; leave it at 0.5).", gt=0, le=1
    )
    val_temperature: float = field(0.0, "Validation temperature (0 = greedy).", ge=0)
    delta_sync: bool = field(
        False,
        "Weight syncs and pushes send only the elements that changed since the rollout copy's "
        "version (per tensor the smallest of index or bitmask positions with values or int8 steps, "
        "or whole); full after a start, a resume or a version gap. Pays with a bf16 rollout copy "
        "(platform.dtype). HF engine, tensor-parallel 1, no LoRA; one rank in sync mode "
        "(docs/async-rollouts.md).",
    )
    engine_kwargs: dict[str, Any] = field(
        {},
        "Extra keywords for the vllm/sglang engine, a TOML table (e.g. {max_model_len = 4096, "
        "enforce_eager = true}); they win over the platform's engine settings (on Ascend "
        "enforce_eager = true). Each key must be a field of the installed vllm.EngineArgs / sglang "
        "ServerArgs (an unknown one exits 2 naming the key and the version); keys rlctl sets from other "
        "profile keys (dtype, seed, memory fraction, tensor parallel, sleep mode) are refused, and so is "
        "a kernel the platform knows cannot run (FLASH_ATTN on ROCm, fa3 off SM 8.x/9.0).",
    )


@dataclass(frozen=True)
class RefSection:
    path: str = field("", "Reference model directory; empty means model.path.", path=True)
    micro_batch_sequences: int = field(32, "Sequences per reference forward.", ge=1)
    micro_batch_tokens: int = field(
        0, "Token budget per reference forward (0 = use micro_batch_sequences).", ge=0
    )


@dataclass(frozen=True)
class CriticSection:
    path: str = field("", "Critic init directory; empty means model.path.", path=True)
    lr: float = field(1e-5, "Critic learning rate.", gt=0)
    warmup_steps: int = field(0, "Critic linear warmup, in RL steps.", ge=0)
    grad_clip: float = field(1.0, "Critic gradient norm clip (0 = off).", ge=0)
    cliprange_value: float = field(0.5, "Value clipping range.", ge=0)
    ppo_epochs: int = field(1, "Critic passes over each step's batch.", ge=1)
    micro_batch_sequences: int = field(16, "Sequences per critic forward/backward.", ge=1)
    micro_batch_tokens: int = field(
        0, "Token budget per critic forward/backward (0 = use micro_batch_sequences).", ge=0
    )


@dataclass(frozen=True)
class RewardSection:
    kind: str = field(
        "builtin",
        "Reward source: builtin (the task's verifier), exact, numeric (the last number; an integer "
        "truth exactly, a fractional one within 1e-6), math (the response's final "
        "answer: last box, after ####, or last number, by value; a contradictory one scores 0), verl (verl's default scorer chosen "
        "by each row's data_source: openai/gsm8k, MATH, math_dapo/aime; unknown sources fail), "
        "custom, code, reward_model.",
        choices=("builtin", "exact", "numeric", "math", "verl", "custom", "code", "reward_model"),
    )
    gsm8k_method: str = field(
        "strict",
        "kind = verl, openai/gsm8k rows: strict (the last '#### N', verl's default) or flexible "
        "(the last number).",
        choices=("strict", "flexible"),
    )
    format_score: float = field(
        0.0, "kind = verl, openai/gsm8k rows: reward for an answer found but wrong (verl's format_score)."
    )
    function: str = field(
        "", "Custom reward 'path/to/file.py:name' (kind = custom); the only code a profile runs."
    )
    model_path: str = field("", "Reward model directory (kind = reward_model).", path=True)
    timeout_s: float = field(5.0, "Per-sample time limit for function/code rewards.", gt=0)
    memory_mb: int = field(512, "Memory limit for sandboxed code rewards.", ge=16)
    sandbox: str = field(
        "strict",
        "Code-reward sandbox level: strict (run snippets only inside pid, mount and network namespaces "
        "as an unprivileged uid; else kind = code fails at start naming the missing layer) or "
        "best-effort (use the layers this host has; rlctl doctor lists them).",
        choices=("strict", "best-effort"),
    )
    max_error_rate: float = field(
        0.1,
        "Fraction of one scoring pass's samples whose reward function may raise before the step "
        "fails (naming the function, the count and the first traceback; timeouts are not errors).",
        ge=0,
        le=1,
    )
    workers: int = field(
        0,
        "Scorer processes for custom/math/verl rewards (a timeout kills and replaces one), concurrent "
        "sandboxes for code rewards; 0 = min(4, CPU count).",
        ge=0,
    )


@dataclass(frozen=True)
class TrainerSection:
    steps: int = field(100, "Training steps.", ge=1)
    prompts_per_step: int = field(8, "Prompts sampled per step (each gets rollout.n responses).", ge=1)
    val_every: int = field(10, "Validate every N steps (0 = only at the end).", ge=0)
    val_at_start: bool = field(True, "Validate before the first step.")
    save_every: int = field(50, "Checkpoint every N steps (0 = only at the end).", ge=0)
    keep_checkpoints: int = field(2, "Checkpoints kept (older ones are deleted).", ge=1)
    stop_grace_s: float = field(
        600.0,
        "After SIGINT/SIGTERM/SIGUSR1: seconds the current step may take to finish and be saved "
        "before the run stops without it (0 = no bound).",
        ge=0,
    )
    export_hf: bool = field(True, "Export the final policy in HF format.")
    loggers: list[str] = field(["console", "jsonl"], "Metric sinks: console, jsonl, tensorboard, wandb.")
    max_log_prob_gap: float = field(
        1.0,
        "Fail the step when rollout/log_prob_diff_mean (mean absolute rollout-vs-trainer log-prob "
        "difference per token, nats) exceeds this; healthy bf16 engine pairs measure 0.005-0.34 "
        "(0 = off).",
        ge=0,
    )
    log_samples: int = field(
        4,
        "Decoded prompt/response/score/ground-truth rows written to RUN_DIR/samples.jsonl at each "
        "validation and every log_samples_every steps; rlctl report shows them (0 = off).",
        ge=0,
    )
    log_samples_every: int = field(
        10, "Write training samples every N steps (0 = only at the end); validation always writes.", ge=0
    )
    mode: str = field(
        "sync",
        "sync (generate, then train, every step on-policy); one_step_off (batch k+1 is generated "
        "with the weights before step k's update while step k trains, deterministic); async "
        "(batches streamed ahead within max_staleness policy versions, newest weights pushed to the "
        "rollout workers before each generation). Off-policy modes run the rollout engine in its "
        "own workers and correct every sample with importance weights (decoupled PPO).",
        choices=("sync", "one_step_off", "async"),
    )
    max_staleness: int = field(
        1,
        "async: most policy versions a trained sample may lag the policy it trains (0 = on-policy, "
        "no overlap); one_step_off always lags exactly 1.",
        ge=0,
    )
    partial_rollouts: str = field(
        "off",
        "async: what happens to sequences still generating. off (each batch generated whole under one "
        "version); swap (rollout workers take each newly published policy between decode steps, KV "
        "cache rebuilt); carry (a round stops once carry_stop_share of its rows still run; those go on "
        "in the next round beside fresh prompts under the newest weights). Each token records its "
        "version; the staleness bound holds per token. Off by default: batches then mix versions by "
        "thread timing. HF engine.",
        choices=("off", "swap", "carry"),
    )
    carry_stop_share: float = field(
        0.25, "partial_rollouts = carry: a round stops once at most this share of its rows still runs.", ge=0, lt=1
    )


@dataclass(frozen=True)
class SftSection:
    steps: int = field(300, "Supervised optimiser steps (rlctl sft).", ge=1)
    batch_sequences: int = field(64, "Sequences per SFT step.", ge=1)
    lr: float = field(1e-3, "SFT learning rate.", gt=0)
    warmup_steps: int = field(10, "SFT warmup steps.", ge=0)
    eval_every: int = field(50, "Greedy validation every N SFT steps (0 = only at the end).", ge=0)
    stop_at_accuracy: float = field(
        0.0, "Stop at the first validation at or above this accuracy (0 = run all steps).", ge=0, le=1
    )
    export_to: str = field("", "Where the SFT'd model is written (default: RUN_DIR/hf).", path=True)


@dataclass
class Profile:
    """A fully resolved, validated profile: what every other module receives."""

    description: str = field("", "One line about this profile.")
    run: RunSection = None  # type: ignore[assignment]
    platform: PlatformSection = None  # type: ignore[assignment]
    cluster: ClusterSection = None  # type: ignore[assignment]
    model: ModelSection = None  # type: ignore[assignment]
    data: DataSection = None  # type: ignore[assignment]
    algorithm: AlgorithmSection = None  # type: ignore[assignment]
    actor: ActorSection = None  # type: ignore[assignment]
    rollout: RolloutSection = None  # type: ignore[assignment]
    ref: RefSection = None  # type: ignore[assignment]
    critic: CriticSection = None  # type: ignore[assignment]
    reward: RewardSection = None  # type: ignore[assignment]
    trainer: TrainerSection = None  # type: ignore[assignment]
    sft: SftSection = None  # type: ignore[assignment]
    agent: AgentSection = None  # type: ignore[assignment]
    source: str = ""  # the file it was loaded from (not a profile key)

    @property
    def uses_reference(self) -> bool:
        """A frozen reference policy is needed when any KL term is on."""
        return self.actor.use_kl_loss or self.algorithm.use_kl_in_reward

    @property
    def uses_critic(self) -> bool:
        """A value model is needed for GAE (PPO)."""
        return self.algorithm.adv_estimator == "gae"

    @property
    def sequences_per_step(self) -> int:
        return self.trainer.prompts_per_step * self.rollout.n


SECTIONS: dict[str, type] = {
    "run": RunSection,
    "platform": PlatformSection,
    "cluster": ClusterSection,
    "model": ModelSection,
    "data": DataSection,
    "algorithm": AlgorithmSection,
    "actor": ActorSection,
    "rollout": RolloutSection,
    "ref": RefSection,
    "critic": CriticSection,
    "reward": RewardSection,
    "trainer": TrainerSection,
    "sft": SftSection,
    "agent": AgentSection,
}
TOP_LEVEL_KEYS = ("extends", "description")
