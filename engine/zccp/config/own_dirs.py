"""Directories ZCCP keeps its sockets, last-good copies and logs in, and the operator's
plugin directory, are its own: owned by the user starting it or by root, writable by
nobody else (and, for the admin socket's, not enterable by others). One already there that
fails this was made by someone else (a local user who created /tmp/zccp/admin before the
stack started would get the admin socket): it is refused with its path, never used.

The one exception is the stack's own group (shared_memory.group): systemd's
RuntimeDirectory for an engine of its own user is that user's, mode 2770, group zccp, and
nginx's master (root) writes the masks' last-good copy into it. A directory in that group
may be another member's and writable by the group: only root and the group's members can
give a directory that group, and they are already trusted with the doorbell. Never the
admin socket's: the keys API is more than the doorbell.

    own_dir(path, "server.socket_path's directory")            # made 0755, or checked
    own_dir(path, "the admin socket's directory", private=True)  # made 0700, or checked
    check_own_dir(path, "plugins.dir")                           # exists: only checked
"""

from __future__ import annotations

import grp
import os
import stat
from pathlib import Path

from zccp.config import Config, ConfigError
from zccp.config.paths import make_dirs

PRIVATE_MODE = 0o700


class NotOurDirectory(ConfigError):
    """A directory ZCCP would use that someone else owns or can write to."""


def _owner_ok(uid: int) -> bool:
    return uid in (0, os.geteuid())


def _gid(group: str | None) -> int | None:
    if group is None:
        return None
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return None


def check_own_dir(path: Path, what: str, private: bool = False, group: str | None = None) -> None:
    """Refuse `path` unless it is a directory (not a link someone else made) owned by this
    user or root, that group and others cannot write to; with private, that others cannot
    enter either. A directory of group `group` (the stack's) may be another member's and
    group-writable. NotOurDirectory (a ConfigError) names what and the path."""
    shared = _gid(group)
    try:
        link = path.lstat()
    except FileNotFoundError:
        raise NotOurDirectory(f"{what}: {path} does not exist") from None
    if stat.S_ISLNK(link.st_mode) and not _owner_ok(link.st_uid):
        raise NotOurDirectory(f"{what}: {path} is a symbolic link owned by uid {link.st_uid}, not by this user "
                              f"or root: refusing to use it")
    st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise NotOurDirectory(f"{what}: {path} is not a directory")
    ours_by_group = shared is not None and st.st_gid == shared and not private   # the admin socket's: ours alone
    if not _owner_ok(st.st_uid) and not ours_by_group:
        raise NotOurDirectory(f"{what}: {path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}) "
                              f"or root: someone else made it; refusing to use it (remove it, or choose another path)")
    mode = stat.S_IMODE(st.st_mode)
    if mode & stat.S_IWOTH or (mode & stat.S_IWGRP and not ours_by_group):
        raise NotOurDirectory(f"{what}: {path} (mode {mode:04o}) can be written by its group or by others: "
                              f"refusing to use it (chmod go-w {path})")
    if private and mode & stat.S_IXOTH:
        raise NotOurDirectory(f"{what}: {path} (mode {mode:04o}) can be entered by every user: refusing to use "
                              f"it for a socket (chmod 700 {path})")


def own_dir(path: Path, what: str, private: bool = False, group: str | None = None) -> Path:
    """`path` made when missing (its missing parents 0755, itself 0755, or 0700 with
    private, whatever the umask), then checked (check_own_dir): ours, or refused."""
    if not path.exists() and not path.is_symlink():
        make_dirs(path.parent)
        try:
            path.mkdir(mode=PRIVATE_MODE if private else 0o755)
        except FileExistsError:
            pass   # made meanwhile (by another of our processes, or by someone else: checked below)
        else:
            path.chmod(PRIVATE_MODE if private else 0o755)   # whatever the umask or a setgid parent
    check_own_dir(path, what, private, group)
    return path


def stack_dirs(cfg: Config, engine_only: bool = False) -> list[tuple[Path, str, bool]]:
    """(directory, what it is, private) for every directory a resolved cfg has ZCCP use:
    the doorbell's (the masks' last-good file and, by default, the usage log beside it),
    the admin socket's, plugins.last_good, the usage log's. engine_only: the one the engine
    process itself uses (the doorbell's); the others are nginx's, which may run as another
    user (containers: the admin directory is then the nginx user's, and rightly so)."""
    if cfg.server.socket_path is None:
        raise ValueError("server.socket_path is not resolved (zccp.config.runtime.resolve)")  # programmer error
    sock_dir = Path(cfg.server.socket_path).parent
    if engine_only:
        return [(sock_dir, "server.socket_path's directory", False)]
    dirs = [(sock_dir, "server.socket_path's directory", False),
            (sock_dir / "plugins.last_good", "plugins.last_good (beside server.socket_path)", False)]
    listen = cfg.server.admin_listen or ""
    if listen.startswith("unix:"):
        dirs.append((Path(listen[5:]).parent, "server.admin_listen's directory", True))
    if cfg.auth.usage_log:
        dirs.append((Path(cfg.auth.usage_log).parent, "auth.usage_log's directory", False))
    return dirs


def check_stack_dirs(cfg: Config, engine_only: bool = False) -> None:
    """At start (zccp-stack up, zccp-engine, zccp-nginx): each of stack_dirs that exists
    already is ours (those missing are made by whoever uses them, through own_dir), and
    plugins.dir, which must exist, is too. NotOurDirectory names the first that is not."""
    for path, what, private in stack_dirs(cfg, engine_only):
        if path.exists() or path.is_symlink():
            check_own_dir(path, what, private, cfg.shared_memory.group)
    if cfg.plugins.dir and not engine_only:
        check_own_dir(Path(cfg.plugins.dir), "plugins.dir (operator plugins run inside nginx)")
