"""The layering in ``pyproject.toml`` (``[tool.importlinter]``) holds, and it is not decorative: an
upward import or an import circle planted in a copy of the package breaks it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which(
    "lint-imports"
)
pytestmark = pytest.mark.skipif(LINT_IMPORTS is None, reason="import-linter is not installed")


def lint(tree: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache", "--config", str(tree / "pyproject.toml")],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the package and its contracts, to plant imports in."""
    shutil.copytree(ROOT / "rlctl", tmp_path / "rlctl", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def plant(tree: Path, module: str, line: str) -> None:
    path = tree / (module.replace(".", "/") + ".py")
    path.write_text(path.read_text() + f"\n\ndef _planted():\n    {line}\n")


def test_the_package_keeps_every_contract() -> None:
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "line", "expected"),
    [
        # the runtime reaching back up into the trainer (the arrow the capacity guard once drew)
        (
            "rlctl.dispatch.pool",
            "from rlctl.trainer.setup import context",
            "rlctl.dispatch is not allowed to import rlctl.trainer",
        ),
        # an engine that knows the loop
        (
            "rlctl.engines.logprob",
            "import rlctl.trainer.loops.sync",
            "rlctl.engines is not allowed to import rlctl.trainer",
        ),
        # an algorithm with state
        ("rlctl.algorithms.kl", "import ray", "rlctl.algorithms is not allowed to import ray"),
        # a lower trainer room importing a loop
        (
            "rlctl.trainer.state.checkpoint",
            "from rlctl.trainer.loops import stop",
            "rlctl.trainer.state is not allowed to import rlctl.trainer.loops",
        ),
        # a rollout source reaching back into the loop (what the off-policy loops once did by subclassing)
        (
            "rlctl.trainer.loops.pipelined",
            "from rlctl.trainer.loops import sync",
            "rlctl.trainer.loops.pipelined is not allowed to import rlctl.trainer.loops.sync",
        ),
        # one rollout source importing another
        (
            "rlctl.trainer.loops.colocated",
            "from rlctl.trainer.loops import pipelined",
            "rlctl.trainer.loops.colocated is not allowed to import rlctl.trainer.loops.pipelined",
        ),
        # a platform probe importing torch in-process
        ("rlctl.platforms.nvidia", "import torch", "rlctl.platforms is not allowed to import torch"),
    ],
)
def test_a_planted_upward_import_breaks_the_layering(
    tree: Path, module: str, line: str, expected: str
) -> None:
    plant(tree, module, line)
    done = lint(tree)
    assert done.returncode != 0
    assert expected in " ".join(done.stdout.split()), done.stdout


@pytest.mark.parametrize(
    ("module", "line"),
    [
        ("rlctl.platforms.base", "from rlctl.platforms import resolve"),  # the circle vendors once closed
        ("rlctl.engines.fsdp_io", "from rlctl.engines import fsdp_train"),
        ("rlctl.trainer.setup.prompts", "from rlctl.trainer.setup import context"),
    ],
)
def test_a_planted_import_circle_breaks_the_acyclic_contract(tree: Path, module: str, line: str) -> None:
    plant(tree, module, line)
    done = lint(tree)
    assert done.returncode != 0
    assert (
        "No import circles" in done.stdout and "BROKEN" in done.stdout.split("No import circles")[1][:200]
    ), done.stdout


def test_no_module_is_over_400_lines() -> None:
    """Small modules, one job each: a file that grows past 400 lines is split along a seam."""
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / "rlctl").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert not long, long
