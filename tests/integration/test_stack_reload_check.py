"""`zccp-stack reload`'s check through the real nginx, engine and Lua: one throwaway nginx
on the newly rendered configuration runs zccp.check with the settings nginx would start
with (not zccp-nginx check's minimal ones), refuses by file and line, and puts the files
in force back."""

from __future__ import annotations

import os
import subprocess
import sys

import yaml

from tests.support.harness import REPO, anthropic_body
from zccp.config.plugins import BUILTIN

# Loads only when nginx's settings hold limits (zccp-nginx check's minimal settings do not)
# and refuses a cap of 5000: the check reads the settings nginx would start with.
CAP_GUARD = '''local cap = require("zccp.settings").get().limits.max_tokens_cap
if cap == 5000 then error("refuses a max_tokens_cap of 5000") end
local _M = { name = "cap_guard" }
function _M.prepare(r) return nil end
return _M
'''


def reload(s) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zccp.ops.cli", "stack", "reload", "--config", str(s.config_path),
                           "--run-dir", str(s.run_dir)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(REPO / "engine")))


def test_reload_checks_the_new_configuration_as_nginx_would_start_with_it(make_stack, tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "cap_guard.lua").write_text(CAP_GUARD)
    s = make_stack({"model": {"backend": "null"}, "plugins": {"dir": str(plugins), "chain": [*BUILTIN, "cap_guard"]}})
    first = reload(s)
    assert first.returncode == 0, first.stdout + first.stderr
    in_force = (s.run_dir / "nginx" / "zccp_http.conf").read_text()
    raw = yaml.safe_load(s.config_path.read_text())
    raw.setdefault("limits", {})["max_tokens_cap"] = 5000
    s.config_path.write_text(yaml.safe_dump(raw))
    out = reload(s)
    assert out.returncode == 1 and f"{plugins / 'cap_guard.lua'}:2: refuses a max_tokens_cap of 5000" in out.stderr, \
        out.stdout + out.stderr
    assert "not reloaded" in out.stderr
    assert (s.run_dir / "nginx" / "zccp_http.conf").read_text() == in_force   # the files in force put back
    assert s.client().post("/v1/messages", json=anthropic_body()).status_code == 200
