"""zccp-nginx check: the mask patterns and the plugins compiled by this host's nginx (its
PCRE and LuaJIT, a throwaway process), each refusal as file:line, exit 1; a setting its
plugin's schema refuses named by config file and key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from zccp.config.plugins import BUILTIN

REPO = Path(__file__).resolve().parents[2]

MASKS = '''return {
    { name = "ticket", pattern = [[TCK-\\d+]], replacement = "TCK-#" },
    {
        name = "broken",
        pattern = [[(\\d+]],
        replacement = "x",
    },
}
'''
PLUGIN = 'local _M = { name = "mine" }\nfunction _M.prepare(r)\n    return nil nil\nend\nreturn _M\n'


def _check(tmp: Path, masks: str, plugin: str | None, settings: dict | None = None) -> subprocess.CompletedProcess[str]:
    (tmp / "masks.lua").write_text(masks)
    raw: dict = {"server": {"socket_path": str(tmp / "s" / "doorbell.sock")},
                 "cache": {"mask_patterns": str(tmp / "masks.lua")}}
    if plugin is not None:
        (tmp / "plugins").mkdir(exist_ok=True)
        (tmp / "plugins" / "mine.lua").write_text(plugin)
        raw["plugins"] = {"dir": str(tmp / "plugins"), "chain": [*BUILTIN, "mine"]}
        if settings is not None:
            raw["plugins"]["settings"] = {"mine": settings}
    (tmp / "config.yaml").write_text(yaml.safe_dump(raw))
    return subprocess.run([sys.executable, "-m", "zccp.ops.cli", "nginx", "check", "--config", str(tmp / "config.yaml"),
                           "--run-dir", str(tmp / "run")], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO / "engine")))


def test_a_broken_mask_and_a_broken_plugin_exit_1_with_file_and_line(tmp_path):
    r = _check(tmp_path, MASKS, PLUGIN)
    assert r.returncode == 1, r.stdout + r.stderr
    errs = r.stderr.splitlines()
    assert f'{tmp_path}/masks.lua:4: pattern "broken": pcre_compile() failed: missing ) in "(\\d+"' in errs, errs
    assert any(e.startswith(f"{tmp_path}/plugins/mine.lua:3: 'end' expected") for e in errs), errs
    assert "1 mask pattern(s)" in r.stdout and f"{len(BUILTIN)} plugin(s) compiled; 2 refused" in r.stdout


def test_good_masks_and_plugins_exit_0(tmp_path):
    r = _check(tmp_path, MASKS.replace("[[(\\d+]]", "[[(\\d+)]]"),
               PLUGIN.replace("return nil nil", "return nil"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"2 mask pattern(s) and {len(BUILTIN) + 1} plugin(s) compiled" in r.stdout


SCHEMA_PLUGIN = ('local _M = { name = "mine", schema = {\n'
                 '    words = { type = "array", items = "string", required = true },\n'
                 '    status = { type = "integer", default = 403 },\n'
                 '} }\nfunction _M.prepare(r, conf)\n    return nil\nend\nreturn _M\n')


@pytest.mark.parametrize("settings,said", [
    ({"words": ["x"], "wrods": ["y"]}, "plugins.settings.mine.wrods: unknown setting (known: status, words)"),
    ({"words": ["x"], "status": "high"}, "plugins.settings.mine.status: expected integer, got high"),
    ({"status": 400}, "plugins.settings.mine.words: required"),
])
def test_a_setting_the_schema_refuses_is_named_by_config_file_and_key(tmp_path, settings, said):
    r = _check(tmp_path, MASKS.replace("[[(\\d+]]", "[[(\\d+)]]"), SCHEMA_PLUGIN, settings)
    assert r.returncode == 1, r.stdout + r.stderr
    want = f"{tmp_path}/config.yaml: {said} ({tmp_path}/plugins/mine.lua's schema)"
    assert want in r.stderr.splitlines(), r.stderr
    ok = _check(tmp_path, MASKS.replace("[[(\\d+]]", "[[(\\d+)]]"), SCHEMA_PLUGIN, {"words": ["x"], "status": 400})
    assert ok.returncode == 0, ok.stdout + ok.stderr
