"""``rlctl train`` end to end: profile -> run directory -> context -> Trainer.fit -> shutdown."""

from __future__ import annotations

from pathlib import Path

from rlctl.log import get_logger
from rlctl.profile import Profile, profile_to_toml
from rlctl.tracking.run_files import RunLock, prepare_run_dir, write_text_nofollow

log = get_logger("rlctl.train")


def run_dir_for(profile: Profile, output_dir: str | None) -> Path:
    return Path(output_dir or profile.run.output_dir) / profile.run.name


def train(
    profile: Profile, *, output_dir: str | None = None, max_steps: int | None = None, resume: str = "auto"
) -> dict:
    """Run (or resume) the RL loop the profile describes; returns the last step's metrics."""
    from dataclasses import replace

    from rlctl.trainer.loops.modes import trainer_class
    from rlctl.trainer.plan.run_plan import refuse_failures, resolve_plan
    from rlctl.trainer.setup.context import build_context
    from rlctl.trainer.setup.models import materialize_model
    from rlctl.trainer.state.checkpoint import find_resume_point

    run_dir = run_dir_for(profile, output_dir)
    if resume not in ("auto", "never"):
        find_resume_point(run_dir, resume)  # a bad --resume PATH fails here, before any worker starts
    plan = resolve_plan(profile)
    refuse_failures(plan)  # one line naming each FAIL check and its fix; no worker has started
    run_dir = prepare_run_dir(run_dir)  # ours, writable by no one else, no symlink where we write
    with RunLock(run_dir):  # a second run on this directory exits 2 naming this one's pid and host
        model_path = materialize_model(profile.model.path, run_dir / "base_model", seed=profile.run.seed)
        profile = replace(profile, model=replace(profile.model, path=model_path))
        write_text_nofollow(run_dir / "profile.toml", profile_to_toml(profile))
        write_text_nofollow(run_dir / "plan.json", plan.to_json())
        log.info("run directory", path=str(run_dir), plan="plan.json", predicted_peak_gib=plan.memory.get(
            "predicted_peak_gib"))
        ctx = build_context(profile, run_dir, plan)
        try:
            return trainer_class(profile)(ctx, max_steps=max_steps, resume=resume).fit()
        finally:
            ctx.shutdown()
