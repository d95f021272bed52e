"""Which rows the actor's update may leave out of its forward: exactly those whose gradient is zero."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rlctl.algorithms import POLICY_LOSSES, advantage_linear_losses, get_policy_loss, register_policy_loss
from rlctl.engines.optim import LossScale
from rlctl.profile import load_profile
from rlctl.profile.schema import ActorSection
from rlctl.trainer.plan.specs import ActorLossSpec, build_specs
from rlctl.trainer.workers.losses import make_actor_loss, zero_gradient_rows

ON = ActorLossSpec(ActorSection(skip_zero_advantage=True))


def on(**actor) -> ActorLossSpec:
    """``ON`` with these ``[actor]`` keys."""
    return replace(ON, actor=replace(ON.actor, **actor))
REPO = Path(__file__).resolve().parents[2]


def _batch(adv: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"advantages": adv, "response_mask": mask}


def test_zero_advantage_and_empty_rows_are_marked():
    adv = torch.tensor([[0.0, 0, 0], [0, 0.5, 0], [0, 0, 3.0], [1.0, 1, 1]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0], [0, 0, 0]])
    # row 2's only nonzero advantage is on a masked position; row 3 has no loss tokens
    assert zero_gradient_rows(ON, _batch(adv, mask)).tolist() == [True, False, True, True]


@pytest.mark.parametrize(
    "spec",
    [
        ActorLossSpec(ActorSection(skip_zero_advantage=False)),  # the profile key off
        on(entropy_coeff=0.01),  # the entropy bonus has a gradient on every row
        on(use_kl_loss=True),  # so has the KL loss
        on(policy_loss="my_own"),  # a registered loss is not assumed linear in A
    ],
)
def test_nothing_is_skipped_where_a_zero_advantage_row_can_still_have_a_gradient(spec):
    adv, mask = torch.zeros(2, 3), torch.ones(2, 3)
    assert zero_gradient_rows(spec, _batch(adv, mask)) is None


@settings(max_examples=40, deadline=None)
@given(
    policy_loss=st.sampled_from(advantage_linear_losses()),
    agg=st.sampled_from(
        ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
    ),
    seed=st.integers(0, 2**16),
    correction=st.sampled_from(["off", "token", "sequence"]),
)
def test_rows_marked_have_exactly_zero_gradient_in_every_builtin_loss(policy_loss, agg, seed, correction):
    """The rule's premise, on off-policy ratios far from 1 (every clip branch taken) and with a
    rollout correction: the loss's gradient on a marked row's log-probs is exactly zero."""
    g = torch.Generator().manual_seed(seed)
    rows, width = 6, 5
    adv = torch.randn(rows, 1, generator=g).expand(-1, width).clone()
    adv[::2] = 0.0
    mask = (torch.rand(rows, width, generator=g) > 0.2).long()
    log_prob = (torch.randn(rows, width, generator=g) - 1).requires_grad_(True)
    mb = {
        **_batch(adv, mask),
        "old_log_probs": log_prob.detach() + torch.randn(rows, width, generator=g),
        "rollout_log_probs": log_prob.detach() + 0.3 * torch.randn(rows, width, generator=g),
    }
    spec = replace(on(policy_loss=policy_loss, loss_agg_mode=agg), rollout_correction=correction)
    scale = LossScale(global_tokens=int(mask.sum()), global_seqs=rows, dp_size=1)
    loss, _ = make_actor_loss(spec)({"log_probs": log_prob}, mb, scale)
    loss.backward()
    marked = zero_gradient_rows(spec, mb)
    assert marked[::2].all()
    assert torch.equal(log_prob.grad[marked], torch.zeros_like(log_prob.grad[marked]))
    # not vacuous: the other rows have a gradient (gspo can clip every sequence at these ratios,
    # e.g. seed 61000: then the example says nothing either way)
    assume(log_prob.grad[~marked].abs().sum() > 0)


def test_the_profile_key_reaches_the_loss_spec():
    def spec(*overrides: str) -> ActorLossSpec:
        profile = load_profile(REPO / "profiles/tiny-cpu.toml", list(overrides))
        kw = dict(device_type="cpu", dtype="float32", attn="sdpa", dist_backend="gloo")
        return build_specs(profile, **kw).policy.loss

    assert spec().actor.skip_zero_advantage is True
    assert spec("actor.skip_zero_advantage=false").actor.skip_zero_advantage is False


def test_the_builtin_advantage_linear_losses_declare_it():
    assert advantage_linear_losses() == ["cispo", "gpg", "gspo", "vanilla"]


def test_a_loss_registered_over_a_builtin_name_is_not_skipped_unless_it_declares_it():
    """A user loss over "vanilla" with a term independent of the advantage: its zero-advantage rows
    have a gradient, so skipping them by the name would lose it."""
    builtin = get_policy_loss("vanilla")

    def with_length_term(old, log_prob, adv, mask, loss_agg_mode=None, config=None, weights=None):
        loss, metrics = builtin(old, log_prob, adv, mask, loss_agg_mode, config, weights)
        return loss + 0.01 * (log_prob * mask).sum() / mask.sum(), metrics

    adv, mask = torch.zeros(2, 3), torch.ones(2, 3)
    try:
        register_policy_loss("vanilla", override=True)(with_length_term)
        assert zero_gradient_rows(ON, _batch(adv, mask)) is None
        register_policy_loss("vanilla", override=True, advantage_linear=True)(with_length_term)
        assert zero_gradient_rows(ON, _batch(adv, mask)) is not None  # declared: the user's word
    finally:
        register_policy_loss("vanilla", override=True, advantage_linear=True)(builtin)
    assert POLICY_LOSSES.get("vanilla") is builtin
