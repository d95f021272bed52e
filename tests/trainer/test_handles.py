"""Each role's typed handle declares exactly its worker's ``@register`` methods, so every call the
driver makes on a group resolves to a worker method (a renamed or added worker method fails here)."""

from __future__ import annotations

import pytest

from rlctl.dispatch.modes import registered_methods
from rlctl.dispatch.remote import declared_methods
from rlctl.trainer.workers.handles import CriticGroup, PolicyGroup, ReferenceGroup
from rlctl.trainer.workers.roles import CriticWorker, PolicyWorker, ReferenceWorker
from rlctl.trainer.workers.rollout import RolloutGroup, RolloutWorker

PAIRS = [
    (PolicyGroup, PolicyWorker),
    (ReferenceGroup, ReferenceWorker),
    (CriticGroup, CriticWorker),
    (RolloutGroup, RolloutWorker),
]


@pytest.mark.parametrize(("handle", "worker"), PAIRS, ids=lambda c: c.__name__)
def test_handle_declares_exactly_the_workers_methods(handle, worker):
    declared = declared_methods(handle)
    assert set(declared) == set(registered_methods(worker))
    for name, method in declared.items():  # each declaration is the worker's own method
        assert method.method is getattr(worker, name), name


def test_a_lora_policy_serves_as_the_reference_handle():
    """``ctx.ref`` is the policy group when a LoRA policy is its own reference: every method the
    reference handle declares exists on the policy's worker."""
    assert set(declared_methods(ReferenceGroup)) - {"init_model"} <= set(registered_methods(PolicyWorker))
