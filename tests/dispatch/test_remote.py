"""Typed worker-group handles: ``remote(Worker.method)`` declarations reach the worker's method,
and a handle that names a method its worker lacks is refused."""

from __future__ import annotations

import pytest

from rlctl.dispatch import Dispatch, ResourcePool, Worker, WorkerGroup, register, remote, spawn_colocated
from rlctl.dispatch.remote import Remote, declared_methods
from rlctl.errors import UserError


class Adder(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def add(self, a: int, b: int = 1) -> int:
        return a + b + self.rank

    @register(Dispatch.RANK_ZERO)
    def undeclared(self) -> str:
        return "by name"


class AdderGroup(WorkerGroup):
    add = remote(Adder.add)


class Renamed(Worker):  # ``add`` renamed: a handle declared against the old name no longer fits
    @register(Dispatch.ONE_TO_ALL)
    def plus(self, a: int, b: int = 1) -> int:
        return a + b


def test_a_declared_method_runs_on_every_rank_with_the_group_options():
    group = spawn_colocated(
        ResourcePool(1, 2), {"adder": Adder}, backend="inprocess", handles={"adder": AdderGroup}
    )
    adder = group["adder"]
    assert isinstance(adder, AdderGroup) and isinstance(AdderGroup.add, Remote)
    assert adder.add(2, b=3) == [5, 6]
    assert adder.add(2, blocking=False).get() == [3, 4]  # timeout= and blocking= as on any group method
    assert adder.undeclared() == "by name"  # undeclared @register methods are still attached by name
    assert set(declared_methods(AdderGroup)) == {"add"}
    adder.shutdown()


def test_a_handle_naming_a_method_its_worker_lacks_is_refused():
    with pytest.raises(UserError, match="AdderGroup declares add, which Renamed has no @register"):
        spawn_colocated(
            ResourcePool(1, 1), {"adder": Renamed}, backend="inprocess", handles={"adder": AdderGroup}
        )


def test_declarations_are_checked_where_they_are_written():
    def plain(self) -> None: ...

    with pytest.raises(TypeError, match="not a @register'd worker method"):
        remote(plain)
    with pytest.raises((TypeError, RuntimeError)) as info:  # Python 3.11 wraps it in a RuntimeError

        class Misnamed(WorkerGroup):
            total = remote(Adder.add)

    assert "Misnamed.total declares Adder.add: use its name" in str(info.value.__cause__ or info.value)
