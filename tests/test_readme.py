"""The README's two first-screen commands stay true: CI runs the same test command."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _bash_blocks() -> list[str]:
    text = (REPO / "README.md").read_text()
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_first_screen_has_train_and_test_commands():
    blocks = _bash_blocks()
    assert len(blocks) >= 2
    train, test = blocks[0], blocks[1]
    assert "rlctl train profiles/tiny-cpu.toml" in train
    assert "pip install torch==2.13.0" in train.replace("-q ", "")
    assert "pytest" in test
    first_screen = "\n".join((REPO / "README.md").read_text().splitlines()[:40])
    assert train in first_screen and test in first_screen


def test_ci_runs_the_readme_test_command():
    test = _bash_blocks()[1]
    ci = (REPO / ".ci/run").read_text()
    assert test in ci


def test_profiles_named_in_readme_exist():
    text = (REPO / "README.md").read_text()
    for name in set(re.findall(r"profiles/[\w.-]+\.toml", text)):
        assert (REPO / name).is_file(), name
