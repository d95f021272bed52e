"""``rlctl train`` end to end: profile -> run directory -> context -> Trainer.fit -> shutdown."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from rlctl.errors import Stopped
from rlctl.log import get_logger
from rlctl.profile import Profile, profile_to_toml
from rlctl.tracking.run_files import claimed_run_dir, write_text_nofollow

log = get_logger("rlctl.train")
STOP_SHUTDOWN_S = 10.0  # of SLURM's default 30 s grace: the step and the save come first


def run_dir_for(profile: Profile, output_dir: str | None) -> Path:
    return Path(output_dir or profile.run.output_dir) / profile.run.name


def train(
    profile: Profile, *, output_dir: str | None = None, max_steps: int | None = None, resume: str = "auto"
) -> dict:
    """Run (or resume) the RL loop the profile describes; returns the last step's metrics."""
    from dataclasses import replace

    from rlctl.trainer.loops.modes import rollout_source
    from rlctl.trainer.loops.sync import Trainer
    from rlctl.trainer.plan.run_plan import refuse_failures, resolve_plan
    from rlctl.trainer.setup.context import build_context
    from rlctl.trainer.setup.models import materialize_model
    from rlctl.trainer.state import checkpoint

    plan = resolve_plan(profile)  # the one resolution: workers are built from its specs
    refuse_failures(plan)  # one line naming each FAIL check and its fix; no worker has started
    # ours, writable by no one else, no symlink where we write; a second run on this directory exits
    # 2 naming this one's pid and host; created here and left empty, it is removed if the run fails
    with claimed_run_dir(run_dir_for(profile, output_dir)) as run_dir:
        def carries_over(path: Path, state: dict) -> None:  # the roles this run's checkpoints hold
            checkpoint.check_carries_over(path, state, plan.checkpointed_roles)

        # what the run continues (a --resume PATH read here, once), decided under the lock before
        # any worker starts
        point = checkpoint.prepare_resume(run_dir, resume, check=carries_over)
        model_path = materialize_model(profile.model.path, run_dir / "base_model", seed=profile.run.seed)
        plan = plan.with_model_path(profile.model.path, model_path)
        profile = replace(profile, model=replace(profile.model, path=model_path))
        write_text_nofollow(run_dir / "profile.toml", profile_to_toml(profile))
        write_text_nofollow(run_dir / "plan.json", plan.to_json())
        log.info("run directory", path=str(run_dir), plan="plan.json", predicted_peak_gib=plan.memory.get(
            "predicted_peak_gib"))
        ctx = build_context(profile, run_dir, plan)
        try:
            result = Trainer(ctx, source=rollout_source(ctx), max_steps=max_steps, resume=point).fit()
        except Stopped:  # the checkpoint is saved: stopping the workers must not outlast the grace
            shutdown_within(ctx.shutdown, STOP_SHUTDOWN_S)
            raise
        except BaseException:
            ctx.shutdown()
            raise
        ctx.shutdown()
        return result


def shutdown_within(shutdown: Callable[[], None], seconds: float) -> bool:
    """Run ``shutdown`` for at most ``seconds`` (in a daemon thread); whether it finished.

    After a stop signal the run's state is already saved; a worker runtime that cannot answer
    (its processes gone with the same signal) must not hold the exit past the scheduler's grace
    period. What is left running is killed with the driver (the Ray backend's watchdog).
    """
    errors: list[BaseException] = []

    def run() -> None:
        try:
            shutdown()
        except BaseException as exc:  # noqa: BLE001 - reported below; the stop's exit code stands
            errors.append(exc)

    thread = threading.Thread(target=run, name="rlctl-shutdown", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        log.warning("workers did not stop in time; leaving them to end with this process", seconds=seconds)
        return False
    if errors:
        log.warning("stopping the workers failed", error=f"{type(errors[0]).__name__}: {errors[0]}")
    return not errors
