"""Where the project's data files live: the Lua modules, the nginx templates, the ABI header.

One resolver for every module that needs them. In a checkout (or an editable
install) they sit beside `engine/`; `pip install .` copies them to
`<prefix>/share/zccp/` (pyproject's data-files); ZCCP_HOME overrides both.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from functools import lru_cache
from pathlib import Path

# A directory is the data root when it holds all of these.
_MARKERS = ("lua/zccp/handler.lua", "nginx/zccp_http.conf", "shm_abi/zccp_abi.h")


def _is_root(p: Path) -> bool:
    return all((p / m).is_file() for m in _MARKERS)


def _candidates() -> list[Path]:
    out = []
    if env := os.environ.get("ZCCP_HOME"):
        out.append(Path(env))
    here = Path(__file__).resolve()
    out.append(here.parents[3])                                 # a checkout: engine/zccp/config/paths.py
    # pip install . (data-files): <prefix>/share/zccp beside <prefix>/lib/pythonX.Y/site-packages/zccp
    prefixes = [here.parents[5]] if len(here.parents) > 5 else []
    prefixes += [Path(p) for p in (sysconfig.get_path("data"), sys.prefix, sys.base_prefix)]
    out += [p / "share" / "zccp" for p in prefixes]
    return out


@lru_cache(maxsize=1)
def data_root() -> Path:
    """The directory holding lua/, nginx/ and shm_abi/."""
    tried = _candidates()
    for p in tried:
        if _is_root(p):
            return p
    raise FileNotFoundError("ZCCP's data files (lua/, nginx/, shm_abi/) not found; looked in "
                            + ", ".join(map(str, tried)) + " (set ZCCP_HOME to the directory holding them)")


def lua_dir() -> Path:
    """The directory on nginx's lua_package_path (it holds zccp/*.lua)."""
    return data_root() / "lua"


def lua_vendor_dir() -> Path:
    """Debian's OpenResty libraries, unpacked without their nginx dependency
    (`zccp-nginx vendor-lua`, zccp.ops.lua_vendor): lua-vendor/ beside lua/."""
    return data_root() / "lua-vendor"


def lua_package_path() -> str:
    """nginx's lua_package_path: ZCCP's modules, the vendored libraries, then nginx's
    default path (the `;;`: resty.core and the rest of Debian's and OpenResty's Lua)."""
    return f"{lua_dir()}/?.lua;{lua_vendor_dir()}/?.lua;;"


def lua_file(name: str) -> Path:
    """A file of the Lua package, e.g. lua_file("fp/tables.lua")."""
    return lua_dir() / "zccp" / name


def nginx_template(name: str) -> Path:
    return data_root() / "nginx" / name


def abi_header() -> Path:
    env = os.environ.get("ZCCP_ABI_HEADER")
    return Path(env) if env else data_root() / "shm_abi" / "zccp_abi.h"


def make_dirs(path: Path) -> None:
    """mkdir -p with 0755 directories whatever the process's umask: nginx's workers must
    traverse them, nobody else may write in them (and so replace a socket or a file)."""
    old = os.umask(0o022)
    try:
        path.mkdir(parents=True, exist_ok=True)
    finally:
        os.umask(old)
