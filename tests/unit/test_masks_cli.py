"""zccp-masks test: what each pattern changes in samples (nginx's PCRE), and a warning for a
pattern that matched nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PATTERNS = '''return {
    { name = "ticket", pattern = [[TCK-\\d+]], replacement = "TCK-#" },
    { name = "typo", pattern = [[ORDR-\\d+]], replacement = "ORDER-#" },
    { name = "email", pattern = [[\\b[a-z]+@[a-z]+\\.[a-z]{2,}\\b]], replacement = "<email>" },
}
'''


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "zccp.ops.masks_cli", "test", *args], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO / "engine")))


def test_shows_each_change_and_flags_a_pattern_that_matched_nothing(tmp_path):
    f = tmp_path / "masks.lua"
    f.write_text(PATTERNS)
    body = {"model": "m", "system": "mail bob@example.com",
            "messages": [{"role": "user", "content": "close TCK-1234 and ORDER-55"}]}
    r = _run(str(f), "--text", "ticket TCK-77 for ann@corp.io", "--json", json.dumps(body))
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout.splitlines()
    assert "ticket: 'TCK-77' -> 'TCK-#'" in out and "ticket: 'TCK-1234' -> 'TCK-#'" in out
    assert "email: 'ann@corp.io' -> '<email>'" in out and "email: 'bob@example.com' -> '<email>'" in out
    assert "typo: WARNING: matched nothing in the samples" in out
    assert "masked: 'ticket TCK-# for <email>'" in out and "masked: 'close TCK-# and ORDER-55'" in out
    assert "model" not in r.stdout                     # only the strings nginx masks


def test_a_pattern_pcre_refuses_exits_1(tmp_path):
    f = tmp_path / "masks.lua"
    f.write_text('return { { name = "bad", pattern = [[(\\d+]], replacement = "x" } }\n')
    r = _run(str(f), "--text", "123")
    assert r.returncode == 1 and 'bad: REFUSED: pcre_compile() failed: missing ) in "(\\d+"' in r.stdout, r.stdout
