"""`zccp-nginx check`: the mask patterns and the plugin chain, compiled by nginx itself.

A mask pattern or a plugin that nginx refuses does not fail `nginx -t` nor the reload:
the last good version stays in force and the refusal is only in nginx's error log. This
runs the operator's nginx binary in a temporary prefix with a minimal configuration (no
listener, one process) whose init_by_lua is zccp.check: the same PCRE and LuaJIT as the
real nginx, nothing of the real one touched. Documented reload line:
`zccp-nginx check && nginx -t && systemctl reload nginx` (docs/existing-nginx.md).

`zccp-stack reload` runs the same check (zccp.check, the same report) on the stack's own
rendered configuration instead: `check_rendered`, one throwaway nginx (zccp.init hands its
settings to zccp.check when ZCCP_CHECK_DIR is set).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from zccp.transport.abi import HEADER_PATH
from zccp.config import Config
from zccp.ops.nginx_conf import lua_path
from zccp.config.paths import lua_file
from zccp.config.plugins import in_config, lua_settings

MODULES = Path("/usr/lib/nginx/modules")
# `nginx -t` does not run init_by_lua: nginx runs for real, one process and no listener,
# and zccp.check ends it (os.exit) once the report is written, before it would serve.
_CONF = """\
pid {tmp}/nginx.pid;
daemon off;
master_process off;
{modules}
events {{}}
http {{
    client_body_temp_path {tmp}/body;
    lua_package_path "{lua_package_path}";
    init_by_lua_block {{
        require("zccp.check").run({{ mask_patterns = "{masks}", report = "{tmp}/report",
                                    plugins = {plugins}, settings = {settings} }})
        os.exit(0)
    }}
}}
"""


class CheckError(RuntimeError):
    """nginx could not run the check at all (no binary, no Lua module): the message says why."""


@dataclass
class CheckResult:
    errors: list[str] = field(default_factory=list)   # "file:line: why", masks then plugins
    masks: int = 0                                     # patterns that compiled
    plugins: int = 0                                   # plugins of the chain that loaded

    @property
    def ok(self) -> bool:
        return not self.errors


def _needs_modules(nginx: str) -> bool:
    """Whether this nginx loads the Lua module dynamically (Debian's) rather than having
    it built in (OpenResty)."""
    v = subprocess.run([nginx, "-V"], capture_output=True, text=True, timeout=30)
    return "lua-nginx-module" not in (v.stderr + v.stdout) and (MODULES / "ngx_http_lua_module.so").exists()


def _quoted(value: str, what: str) -> str:
    if any(c in value for c in '"\\\n\r'):
        raise CheckError(f"{what}: {value!r} cannot be written into the check's configuration")
    return value


def _settings(cfg: Config) -> str:
    """What the plugins may read from zccp.settings while they load (the real values; no
    secret: auth's mode only, which decides whether the key plugins are active)."""
    from zccp.ops.nginx_conf import engines_settings

    shm = _quoted(cfg.shared_memory.name, "shared_memory.name")
    sock = _quoted(cfg.server.socket_path or "", "server.socket_path")
    abi = _quoted(str(HEADER_PATH), "ABI header")
    return (f'{{ abi_header = "{abi}", shm_name = "{shm}", socket_path = "{sock}", '
            f"connect_timeout_ms = {cfg.server.connect_timeout_ms}, "
            f"request_timeout_ms = {cfg.limits.request_timeout_ms}, "
            f"stream_max_duration_ms = {cfg.limits.stream_max_duration_ms}, "
            f"stream_max_bytes = {cfg.limits.stream_max_bytes_kb * 1024}, "
            f"max_body = {cfg.limits.max_body_kb * 1024}, pool_size = {cfg.server.doorbell_pool_size}, "
            f'dict = "zccp_slots", tenant_source = "{cfg.cache.tenant_source}", '
            f'engines = {engines_settings(cfg)}, auth = {{ mode = "{"keys" if cfg.auth.on else "off"}" }} }}')


def run_check(cfg: Config, nginx: str | None = None) -> CheckResult:
    nginx = nginx or shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists() and not shutil.which(nginx):
        raise CheckError(f"no nginx binary at {nginx}")
    masks = cfg.cache.mask_patterns or str(lua_file("mask_patterns.lua"))
    with tempfile.TemporaryDirectory(prefix="zccp-check-") as d:
        tmp = Path(d)
        (tmp / "logs").mkdir()
        (tmp / "last_good").mkdir()
        modules = ""
        if _needs_modules(nginx):
            modules = "\n".join(f"load_module {MODULES / m};" for m in ("ndk_http_module.so",
                                                                       "ngx_http_lua_module.so"))
        conf = tmp / "check.conf"
        conf.write_text(_CONF.format(tmp=_quoted(str(tmp), "temporary directory"), modules=modules,
                                     lua_package_path=lua_path(),   # the vendored libraries' too
                                     masks=_quoted(str(Path(masks).resolve()), "cache.mask_patterns"),
                                     plugins=lua_settings(cfg.plugins, tmp / "last_good"),
                                     settings=_settings(cfg)))
        try:
            r = subprocess.run([nginx, "-p", str(tmp), "-e", str(tmp / "logs" / "error.log"), "-c", str(conf)],
                               capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise CheckError(f"{nginx} did not end the check within 120 s") from None
        return _report(tmp, r, nginx, cfg)


def check_rendered(nginx: str, prefix: Path, nginx_conf: Path, cfg: Config) -> CheckResult:
    """The check on a rendered nginx.conf (`zccp-stack reload`'s): its init_by_lua, with
    ZCCP_CHECK_DIR set, runs zccp.check with the settings it would start with; the good
    copies go to a scratch directory, the ones in force are not touched."""
    with tempfile.TemporaryDirectory(prefix="zccp-check-") as d:
        tmp = Path(d)
        (tmp / "logs").mkdir()
        (tmp / "last_good").mkdir()
        try:
            r = subprocess.run([nginx, "-p", str(prefix), "-e", str(tmp / "logs" / "error.log"),
                                "-c", str(nginx_conf), "-g", "daemon off; master_process off;"],
                               capture_output=True, text=True, timeout=120,
                               env=dict(os.environ, ZCCP_CHECK_DIR=str(tmp)))
        except subprocess.TimeoutExpired:
            raise CheckError(f"{nginx} did not end the check within 120 s") from None
        return _report(tmp, r, nginx, cfg)


def _report(tmp: Path, r: subprocess.CompletedProcess[str], nginx: str, cfg: Config) -> CheckResult:
    """zccp.check's report (<tmp>/report): one "kind<TAB>text" line per refusal, then the counts."""
    report = tmp / "report"
    if not report.exists():
        log = (tmp / "logs" / "error.log")
        said = (r.stderr + (log.read_text(errors="replace") if log.exists() else "")).strip()
        raise CheckError(f"{nginx} could not run the check (exit {r.returncode}): {said[-2000:]}")
    res = CheckResult()
    for line in report.read_text(errors="replace").splitlines():
        kind, _, text = line.partition("\t")
        if kind == "mask":
            res.errors.append(text)
        elif kind == "plugin":
            res.errors.append(in_config(text, cfg.path))
        elif kind == "masks":
            res.masks = int(text)
        elif kind == "plugins":
            res.plugins = int(text)
    return res
