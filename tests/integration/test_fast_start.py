"""An engine imports only what its backend uses: the null (and upstream) backend's engine
never loads torch, transformers or llguidance, at start or while it answers (its start is
then seconds shorter: bench/restart.md). Read back from the running engine's own memory
maps after requests down every path it has, and from the module table of an engine built
in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.harness import REPO, Stack, anthropic_body
from zccp.model.registry import backend_uses_torch, build_backend

# the packages a backend that computes nothing must not bring in, and a shared library
# each one loads on import (what /proc/<pid>/maps shows of them)
HEAVY = ("torch", "transformers", "llguidance")
HEAVY_LIBS = ("libtorch", "llguidance", "tokenizers")
MODEL = "zccp-null"


def _mapped_heavy(pid: int) -> list[str]:
    paths = {line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if "/" in line}
    return sorted(p for p in paths if any(lib in Path(p).name for lib in HEAVY_LIBS))


def _every_path(s: Stack) -> None:
    """One request down each of the engine's paths for a null model: every answer a 200."""
    c = s.client(timeout=30)
    openai = {"model": MODEL, "max_tokens": 8}
    calls = [
        ("/v1/messages", anthropic_body("plain", model=MODEL)),
        ("/v1/messages", anthropic_body("streamed", model=MODEL, stream=True)),
        ("/v1/messages/count_tokens", {"model": MODEL, "messages": [{"role": "user", "content": "count"}]}),
        ("/v1/chat/completions", {**openai, "messages": [{"role": "user", "content": "chat"}]}),
        ("/v1/chat/completions", {**openai, "messages": [{"role": "user", "content": "chat"}], "stream": True}),
        ("/v1/completions", {**openai, "prompt": ["first prompt", "second prompt"]}),   # several prompts
        ("/v1/completions", {**openai, "prompt": [[1, 2, 3], [4, 5]]}),                 # token ids
        ("/v1/completions", {**openai, "prompt": "n choices", "n": 2}),
    ]
    for path, body in calls:
        r = c.post(path, json=body)
        assert r.status_code == 200, (path, r.status_code, r.text)
    assert c.get("/v1/models").status_code == 200


@pytest.mark.parametrize("delay_ms", [0, 1], ids=["inline", "model-thread"])
def test_a_null_engine_serves_every_path_without_torch(make_stack, delay_ms):
    """delay 0: the null model answers on the event loop; 1 ms a token: through the batch
    scheduler's model thread (admission, prefill, decode), as a slow model's would."""
    s = make_stack({"model": {"backend": "null", "name": MODEL, "null_token_delay_ms": delay_ms}})
    _every_path(s)
    pid = int(s.health()["engine_pid"])
    assert _mapped_heavy(pid) == []
    log = s.engine_log()
    assert "engine serving" in log and "Traceback" not in log


def test_a_tiny_engine_does_load_torch(make_stack):
    """The check above can fail: the tiny model's engine maps libtorch."""
    s = make_stack({"model": {"backend": "tiny"}})
    assert s.client().post("/v1/messages", json=anthropic_body("hi", max_tokens=2)).status_code == 200
    assert any("libtorch" in p for p in _mapped_heavy(int(s.health()["engine_pid"])))


_BUILD = """
import json, sys
from pathlib import Path
from zccp.config import load_config
from zccp.config.runtime import resolve
from zccp.process.engine import Engine
cfg = resolve(load_config(Path(sys.argv[1])), Path(sys.argv[2]))
engine = Engine(cfg)
engine.arena.close()
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[3].split(",")))))
"""


@pytest.mark.parametrize("backend,expected", [("null", []), ("upstream", []), ("tiny", ["torch"])])
def test_the_engine_built_imports_only_its_backends_packages(tmp_path, backend, expected):
    """zccp.process.engine and Engine(cfg) in a fresh interpreter: the heavy packages in sys.modules."""
    upstream = {"urls": ["http://127.0.0.1:9"], "api": "openai", "model": "m"} if backend == "upstream" else {}
    s = Stack(tmp_path / backend, {"model": {"backend": backend}, "upstream": upstream})
    env = {"PYTHONPATH": str(REPO / "engine"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", _BUILD, str(s.config_path), str(s.run_dir), ",".join(HEAVY)],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == expected


@pytest.mark.parametrize("kind", ["null", "upstream", "tiny"])
def test_the_registry_knows_which_backends_use_torch(kind):
    backend = build_backend(kind)
    assert backend.uses_torch is backend_uses_torch(kind)


def test_the_null_model_checks_its_prompt_as_the_torch_ones_do():
    null = build_backend("null", max_context=8)
    assert null.check_prompt(np.array([1, 2, 3], dtype=np.int32)).tolist() == [1, 2, 3]
    for bad, why in (([], "empty"), (list(range(9)), "exceeds"), ([1, 999], "must be in")):
        with pytest.raises(ValueError, match=why):
            null.check_prompt(np.array(bad, dtype=np.int32))
