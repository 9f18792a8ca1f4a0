"""zccp-nginx render --log (zccp.ops.log_file): the zccp_json log made as Debian makes nginx's
logs, an existing file left alone, a planted symlink refused, an unknown owner refused."""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

import pytest

from zccp.ops.log_file import make_log_file

ME = f"{pwd.getpwuid(os.getuid()).pw_name}:{grp.getgrgid(os.getgid()).gr_name}"


def test_the_log_is_made_0640_for_its_owner(tmp_path: Path) -> None:
    owner = "www-data:adm" if os.geteuid() == 0 else ME
    got = make_log_file(tmp_path / "zccp.log", owner)
    st = (tmp_path / "zccp.log").stat()
    want = (pwd.getpwnam(owner.split(":")[0]).pw_uid, grp.getgrnam(owner.split(":")[1]).gr_gid)
    assert got.created and (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o640, *want)
    assert st.st_size == 0


def test_an_existing_log_is_left_as_it_is(tmp_path: Path) -> None:
    log = tmp_path / "zccp.log"
    log.write_text("kept\n")
    log.chmod(0o600)
    got = make_log_file(log, ME)
    assert not got.created and got.mode == 0o600 and log.read_text() == "kept\n"


def test_a_symlink_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("x")
    target.chmod(0o600)
    (tmp_path / "zccp.log").symlink_to(target)
    with pytest.raises(ValueError, match="not a regular file|symbolic link"):
        make_log_file(tmp_path / "zccp.log", ME)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


@pytest.mark.parametrize("owner", ["no-such-user-zccp:adm", "www-data", ":adm"])
def test_an_owner_this_host_lacks_or_malformed_is_refused(tmp_path: Path, owner: str) -> None:
    with pytest.raises(ValueError):
        make_log_file(tmp_path / "zccp.log", owner)
    assert not (tmp_path / "zccp.log").exists()
