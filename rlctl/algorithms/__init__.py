"""rlctl.algorithms: pure tensor functions (advantages, losses, KL, aggregation) in registries.

Imports torch and numpy only (plus ``rlctl.errors``). Names and numbers follow verl's
``core_algos`` where verl defines the same thing; each docstring says where it differs and why.
"""

from rlctl.algorithms import advantages as _advantages  # noqa: F401  (registers estimators)
from rlctl.algorithms import kl as _kl  # noqa: F401  (registers KL estimators)
from rlctl.algorithms import policy_loss as _policy_loss  # noqa: F401  (registers policy losses)
from rlctl.algorithms.advantages import group_stats
from rlctl.algorithms.aggregation import LOSS_AGG_MODES, agg_loss, batch_totals
from rlctl.algorithms.dapo import groups_with_variance, overlong_penalty
from rlctl.algorithms.kl import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_loss,
    kl_penalty,
    make_kl_controller,
)
from rlctl.algorithms.losses import actor_loss, entropy_from_logits, entropy_loss, value_loss
from rlctl.algorithms.masked import (
    compute_response_mask,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    response_mask_from_ids,
)
from rlctl.algorithms.policy_loss import PolicyLossConfig
from rlctl.algorithms.registry import (
    ADV_ESTIMATORS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    advantage_linear_losses,
    get_adv_estimator,
    get_kl_estimator,
    get_policy_loss,
    is_advantage_linear,
    register_adv_estimator,
    register_kl_estimator,
    register_policy_loss,
)
from rlctl.algorithms.rollout_correction import rollout_is_weights

__all__ = [
    "ADV_ESTIMATORS",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "FixedKLController",
    "PolicyLossConfig",
    "actor_loss",
    "advantage_linear_losses",
    "agg_loss",
    "apply_kl_penalty",
    "batch_totals",
    "compute_response_mask",
    "entropy_from_logits",
    "entropy_loss",
    "get_adv_estimator",
    "get_kl_estimator",
    "get_policy_loss",
    "group_stats",
    "groups_with_variance",
    "is_advantage_linear",
    "kl_loss",
    "kl_penalty",
    "make_kl_controller",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "overlong_penalty",
    "register_adv_estimator",
    "register_kl_estimator",
    "register_policy_loss",
    "response_mask_from_ids",
    "rollout_is_weights",
    "value_loss",
]
