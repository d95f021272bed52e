"""Name -> function registries for advantage estimators, policy losses and KL estimators.

A researcher's own estimator is a plain function registered with the decorator::

    from rlctl.algorithms import register_adv_estimator

    @register_adv_estimator("my_baseline")
    def my_baseline(token_level_rewards, response_mask, index=None, **kwargs):
        ...
        return advantages, returns

The names match verl's (``gae``, ``grpo``, ``vanilla``, ...) so a profile written for verl's
``algorithm.adv_estimator`` / ``actor.policy_loss.loss_mode`` reads the same here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from rlctl.errors import UserError

F = TypeVar("F", bound=Callable[..., Any])


class Registry:
    """A named table of functions; unknown names raise ``UserError`` listing what is registered."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._table: dict[str, Callable[..., Any]] = {}
        self._traits: dict[str, dict[str, Any]] = {}

    def register(self, name: str, *, override: bool = False, **traits: Any) -> Callable[[F], F]:
        """Decorator registering ``fn`` under ``name``; a different function under a taken name is an
        error. ``traits`` are what the registration declares about ``fn`` (:meth:`trait`); an
        override replaces them, so a function registered over a built-in's name never inherits its
        declarations."""
        if not isinstance(name, str) or not name:
            raise UserError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def decorator(fn: F) -> F:
            old = self._table.get(name)
            if old is not None and old is not fn and not override:
                raise UserError(
                    f"{self.kind} {name!r} is already registered to {old.__module__}.{old.__qualname__}; "
                    "pick another name or pass override=True"
                )
            self._table[name] = fn
            self._traits[name] = dict(traits)
            return fn

        return decorator

    def get(self, name: str) -> Callable[..., Any]:
        try:
            return self._table[name]
        except (KeyError, TypeError):
            known = ", ".join(sorted(self._table))
            raise UserError(f"unknown {self.kind} {name!r}; registered: {known}") from None

    def trait(self, name: str, trait: str, default: Any = None) -> Any:
        """What ``name``'s registration declared as ``trait`` (``default`` where it declared nothing)."""
        self.get(name)
        return self._traits.get(name, {}).get(trait, default)

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests, notebooks re-running a cell with ``override=False``)."""
        self._table.pop(name, None)
        self._traits.pop(name, None)

    def names(self) -> list[str]:
        return sorted(self._table)

    def __contains__(self, name: object) -> bool:
        return name in self._table


ADV_ESTIMATORS = Registry("advantage estimator")
POLICY_LOSSES = Registry("policy loss")
KL_ESTIMATORS = Registry("KL estimator")


def register_adv_estimator(name: str, *, override: bool = False) -> Callable[[F], F]:
    """Register an estimator ``fn(token_level_rewards, response_mask, ..., **kwargs) -> (adv, returns)``."""
    return ADV_ESTIMATORS.register(name, override=override)


def get_adv_estimator(name: str) -> Callable[..., Any]:
    return ADV_ESTIMATORS.get(name)


def register_policy_loss(
    name: str, *, override: bool = False, advantage_linear: bool = False
) -> Callable[[F], F]:
    """Register a loss with verl's 7-argument contract, returning ``(loss, metrics: dict[str, float])``.

    ``advantage_linear=True`` declares that every token's term is that token's advantage times
    something finite of its own sequence, so a sequence whose advantage is 0 at every token adds
    exactly 0 to the loss, its gradient and its ``pg_clipfrac`` (the actor's update may then skip
    it: ``actor.skip_zero_advantage``). Undeclared, nothing is skipped.
    """
    return POLICY_LOSSES.register(name, override=override, advantage_linear=bool(advantage_linear))


def get_policy_loss(name: str) -> Callable[..., Any]:
    return POLICY_LOSSES.get(name)


def is_advantage_linear(name: str) -> bool:
    """Whether the policy loss registered as ``name`` declared ``advantage_linear=True`` (False for
    a name nothing is registered under)."""
    return name in POLICY_LOSSES and bool(POLICY_LOSSES.trait(name, "advantage_linear", False))


def advantage_linear_losses() -> list[str]:
    """The registered policy losses that declare themselves advantage-linear."""
    return [n for n in POLICY_LOSSES.names() if is_advantage_linear(n)]


def register_kl_estimator(name: str, *, override: bool = False) -> Callable[[F], F]:
    """Register a per-token KL estimator ``fn(logprob, ref_logprob) -> tensor`` (forward value)."""
    return KL_ESTIMATORS.register(name, override=override)


def get_kl_estimator(name: str) -> Callable[..., Any]:
    return KL_ESTIMATORS.get(name)
