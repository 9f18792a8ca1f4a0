"""What a stack derives from its run directory and from the user it starts as.

config.yaml leaves three things to the place a stack runs: the doorbell socket (and,
beside it, the masks' last-good file), the user nginx's workers drop to when the stack
starts as root, and the group the engine then shares with them (arena and sockets 0660
to it). Every process of one stack (zccp-stack, zccp-engine, zccp-nginx) resolves them
here from the same run directory, so they agree without being told twice.
"""

from __future__ import annotations

import dataclasses
import grp
import hashlib
import os
import pwd
import stat
from pathlib import Path

from zccp.config import Config, ConfigError
from zccp.config.own_dirs import check_stack_dirs

SOCKET_NAME = "doorbell.sock"
SUN_PATH_MAX = 107                      # sun_path holds 108 bytes, NUL included
DEFAULT_WORKER_USERS = ("www-data", "nobody")
ROOT_SOCKET_BASE = Path("/run/zccp")    # root's fallback when workers cannot reach the run directory


def log_dir(run_dir: Path) -> Path:
    """Every log of a stack: redis.log, engine.log, nginx-error.log, nginx-access.log."""
    return run_dir / "logs"


def worker_user(cfg: Config) -> str | None:
    """The user nginx's workers run as: None unless we are root (nginx ignores `user` then)."""
    if os.geteuid() != 0:
        return None
    return cfg.server.user or default_worker_user(f"{cfg.path}: server.user")


def default_worker_user(setting: str) -> str:
    """The first of DEFAULT_WORKER_USERS this host has; `setting` names what to set instead."""
    for name in DEFAULT_WORKER_USERS:
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise ConfigError(f"{setting}: none of {', '.join(DEFAULT_WORKER_USERS)} exists; name a user")


def can_traverse(user: str, group: str | None, path: Path) -> bool:
    """Whether `user` (with `group` added, as nginx's `user USER GROUP` sets it) can reach
    into `path`: search permission on every directory from / down to it."""
    pw = pwd.getpwnam(user)
    gids = set(os.getgrouplist(user, pw.pw_gid))
    if group:
        gids.add(grp.getgrnam(group).gr_gid)
    target = path.resolve()
    for d in (*reversed(target.parents), target):
        try:
            st = os.stat(d)
        except FileNotFoundError:
            return True     # made later, by us, with the usual 0755
        if st.st_uid == pw.pw_uid:
            bit = stat.S_IXUSR
        elif st.st_gid in gids:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return False
    return True


def default_socket_path(run_dir: Path, user: str | None, group: str | None) -> Path:
    """<run_dir>/doorbell.sock; as root, when the workers' user cannot reach the run
    directory (a clone under /root, mode 0700), /run/zccp/<digest of run_dir>/doorbell.sock."""
    p = run_dir / SOCKET_NAME
    if user is None or can_traverse(user, group, run_dir):
        return p
    tag = hashlib.sha256(str(run_dir).encode()).hexdigest()[:12]
    return ROOT_SOCKET_BASE / tag / SOCKET_NAME


def engine_socket_path(socket_path: str, name: str) -> str:
    """The doorbell of engine `name` of `engines:`: beside server.socket_path (the masks'
    last-good file and the usage log live there too, for every engine alike)."""
    return str(Path(socket_path).parent / f"doorbell-{name}.sock")


def _check_names(cfg: Config) -> None:
    """The user and group config.yaml names must exist here: ConfigError naming the key."""
    if cfg.shared_memory.group is not None:
        try:
            grp.getgrnam(cfg.shared_memory.group)
        except KeyError:
            raise ConfigError(f"{cfg.path}: shared_memory.group: no group {cfg.shared_memory.group!r} "
                              "on this host") from None
    if cfg.server.user is not None:
        try:
            pwd.getpwnam(cfg.server.user)
        except KeyError:
            raise ConfigError(f"{cfg.path}: server.user: no user {cfg.server.user!r} on this host") from None


def resolve(cfg: Config, run_dir: Path) -> Config:
    """cfg with server.socket_path and shared_memory.group filled in for this run directory."""
    _check_names(cfg)
    run_dir = run_dir.resolve()
    user = worker_user(cfg)
    group = cfg.shared_memory.group
    if user is not None and group is None:
        group = grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name
    socket = cfg.server.socket_path or str(default_socket_path(run_dir, user, group))
    if len(socket.encode()) > SUN_PATH_MAX:
        raise ConfigError(f"{cfg.path}: server.socket_path: {socket} is longer than {SUN_PATH_MAX} bytes "
                          f"(a unix socket's limit); use a shorter --run-dir or set server.socket_path")
    # in a directory of its own, which only its owner may enter (zccp.ops.admin_client)
    admin = cfg.server.admin_listen or "unix:" + str(Path(socket).parent / "admin" / "admin.sock")
    token_file = cfg.server.admin_token_file
    if token_file is not None:   # relative to the config file, like mask_patterns
        token_file = str((Path(cfg.path).parent / token_file).resolve())
    masks = cfg.cache.mask_patterns
    if masks is not None:   # relative to the config file, as an operator reads it
        masks = str((Path(cfg.path).parent / masks).resolve())
    engines = tuple(dataclasses.replace(e, socket_path=engine_socket_path(socket, e.name),
                                        shared_memory=dataclasses.replace(e.shared_memory, group=group))
                    for e in cfg.engines)
    for e in engines:
        if len((e.socket_path or "").encode()) > SUN_PATH_MAX:
            raise ConfigError(f"{cfg.path}: engines.{e.name}: its socket {e.socket_path} is longer than "
                              f"{SUN_PATH_MAX} bytes; use a shorter --run-dir, server.socket_path or engine name")
    return dataclasses.replace(
        cfg,
        engines=engines,
        server=dataclasses.replace(cfg.server, socket_path=socket, admin_listen=admin, admin_token_file=token_file),
        auth=dataclasses.replace(cfg.auth, usage_log=str(Path(socket).parent / "usage.jsonl")
                                 if cfg.auth.usage_log is None else cfg.auth.usage_log),
        shared_memory=dataclasses.replace(cfg.shared_memory, group=group),
        cache=dataclasses.replace(cfg.cache, mask_patterns=masks),
    )


def check_host(cfg: Config, engine_only: bool = False) -> None:
    """What the engine will write to or read must be there (the user and group are checked
    by resolve): ConfigError naming the key otherwise. For a resolved cfg."""
    if cfg.logging.file is not None:
        d = Path(cfg.logging.file).parent
        if not d.is_dir():
            raise ConfigError(f"{cfg.path}: logging.file: directory {d} does not exist")
        if not os.access(d, os.W_OK | os.X_OK):
            raise ConfigError(f"{cfg.path}: logging.file: directory {d} is not writable")
    if cfg.cache.mask_patterns is not None and not Path(cfg.cache.mask_patterns).is_file():
        raise ConfigError(f"{cfg.path}: cache.mask_patterns: {cfg.cache.mask_patterns} is not a file")
    # sockets, last-good copies, the usage log, plugins.dir: ours, or refused (the engine: its own)
    check_stack_dirs(cfg, engine_only)
