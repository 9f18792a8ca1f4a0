"""The zccp_json access log's file, made by `zccp-nginx render --log` as Debian makes its nginx logs.

nginx's master (root) would create it root:root 0644 at the first reload; Debian's
logrotate (/etc/logrotate.d/nginx: `create 0640 www-data adm`, every /var/log/nginx/*.log)
recreates it www-data:adm 0640 at the first rotation. Made so from the start, the file is
the same before and after a rotation (docs/existing-nginx.md, step 6).
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

LOG_MODE = 0o640                    # logrotate's `create 0640 www-data adm`
LOG_OWNER = "www-data:adm"


@dataclass(frozen=True)
class LogFile:
    path: Path
    created: bool                   # False: it was there already and is left as it is
    uid: int
    gid: int
    mode: int


def _ids(owner: str) -> tuple[int, int]:
    """USER:GROUP as ids; a name this host does not have is refused (ValueError)."""
    user, sep, group = owner.partition(":")
    if not sep or not user or not group:
        raise ValueError(f"--log-owner {owner!r}: give USER:GROUP (e.g. {LOG_OWNER})")
    try:
        uid = pwd.getpwnam(user).pw_uid
        gid = grp.getgrnam(group).gr_gid
    except KeyError as exc:
        raise ValueError(f"--log-owner {owner!r}: no such user or group on this host ({exc})") from None
    return uid, gid


def make_log_file(path: Path, owner: str = LOG_OWNER) -> LogFile:
    """Create `path` empty, owned by `owner`, mode 0640; an existing file is not touched (an
    operator's rotation or ownership wins). A symlink is refused (O_NOFOLLOW): the renderer
    runs as root, and a link planted in a log directory must not make it chown elsewhere."""
    uid, gid = _ids(owner)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, LOG_MODE)
    except FileExistsError:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"--log {path}: exists and is not a regular file") from None
        return LogFile(path, False, st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"--log {path}: is a symbolic link") from None
        raise
    try:
        os.fchmod(fd, LOG_MODE)      # whatever the umask
        if os.geteuid() == 0:
            os.fchown(fd, uid, gid)
        elif (uid, gid) != (os.geteuid(), os.getegid()):
            os.unlink(path)
            raise ValueError(f"--log {path}: only root can give it to {owner}")
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return LogFile(path, True, st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))
