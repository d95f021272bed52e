"""The Ray cluster rlctl starts is private, and ``auto`` trusts no file another user could write.

Before: the session directory under the shared /tmp/ray was mode 777, ``auto`` read
/tmp/ray/ray_current_cluster whoever wrote it (or joined any GCS running on the host), and Ray's
token was 0644 in a 0755 ~/.ray.
"""

from __future__ import annotations

import os
import stat

import pytest

from rlctl.dispatch.ray_local import auto_address, private_temp_dir, private_token
from rlctl.errors import UserError

OTHER_UID = 65534


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_temp_dir_is_private():
    path = private_temp_dir()  # Ray makes this one 777 itself: the private one is its parent
    parent = os.path.dirname(path)
    try:
        assert _mode(parent) == 0o700 and os.stat(parent).st_uid == os.geteuid()
        assert len(path) < 40  # room for Ray's socket paths under it (108 bytes at most)
    finally:
        os.rmdir(parent)


def test_auto_reads_only_a_file_no_other_user_could_write(tmp_path):
    root = tmp_path / "ray"
    root.mkdir()
    current = root / "ray_current_cluster"
    with pytest.raises(UserError, match="no .*ray_current_cluster"):
        auto_address(str(current))
    current.write_text("10.0.0.5:6379\n")
    current.chmod(0o644)
    assert auto_address(str(current)) == "10.0.0.5:6379"
    current.chmod(0o666)
    with pytest.raises(UserError, match="writable by others"):
        auto_address(str(current))
    current.chmod(0o644)
    root.chmod(0o777)  # anyone may replace the file: refused; a sticky directory is not
    with pytest.raises(UserError, match="writable by others"):
        auto_address(str(current))
    root.chmod(0o1777)
    assert auto_address(str(current)) == "10.0.0.5:6379"
    if os.geteuid() == 0:
        os.chown(current, OTHER_UID, OTHER_UID)
        with pytest.raises(UserError, match=f"belongs to uid {OTHER_UID}"):
            auto_address(str(current))


def test_the_token_file_is_made_private(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    token = home / ".ray" / "auth_token"
    token.write_text("secret")
    token.chmod(0o644)
    (home / ".ray").chmod(0o755)
    monkeypatch.setenv("HOME", str(home))
    private_token()
    assert _mode(home / ".ray") == 0o700 and _mode(token) == 0o600
