"""The gateway of another commit (the "before" rows), run the way the tests' harness runs it.

`git archive <ref>` of engine/, lua/, nginx/, shm_abi/ and tests/ into a temporary tree; a
child process in that tree (PYTHONPATH=<tree>/engine:<tree>:<tree>/tests) starts that tree's
own Stack (tests/support/harness.py, or tests/harness.py in commits before tests/support)
(redis, engine, nginx on loopback) and prints its URL; closing its stdin stops it.
The same client then sends the same request bodies to it as to this checkout's stack.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_CHILD = r"""
import json, sys
from pathlib import Path
try:
    from tests.support.harness import Stack
except ImportError:  # a commit before tests/support
    from harness import Stack
s = Stack(Path(sys.argv[2]), json.loads(sys.argv[1]), with_redis=True).start()
print("URL " + s.base_url, flush=True)
try:
    sys.stdin.read()
finally:
    s.stop()
"""


class BaselineStack:
    def __init__(self, ref: str, workdir: Path, overrides: dict) -> None:
        self.ref = ref
        self.commit = subprocess.run(["git", "rev-parse", ref], cwd=ROOT, capture_output=True, text=True,
                                     check=True).stdout.strip()
        self.tree = workdir / "baseline_tree"
        self.run_dir = workdir / "baseline_stack"
        self.overrides = overrides
        self._proc: subprocess.Popen | None = None
        self.base_url = ""

    def start(self) -> "BaselineStack":
        archive = subprocess.run(["git", "archive", self.commit, "engine", "lua", "nginx", "shm_abi", "tests"],
                                 cwd=ROOT, capture_output=True, check=True).stdout
        self.tree.mkdir(parents=True)
        subprocess.run(["tar", "-x", "-C", str(self.tree)], input=archive, check=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in (self.tree / "engine", self.tree,
                                                                          self.tree / "tests")))
        self._proc = subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(self.overrides), str(self.run_dir)],
                                      cwd=self.tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line.startswith("URL "):
            self.stop()
            raise RuntimeError(f"the baseline stack ({self.ref}) did not start; see {self.run_dir}/logs")
        self.base_url = line.split(" ", 1)[1].strip()
        return self

    def stop(self) -> None:
        if self._proc is None:
            return
        if self._proc.stdin:
            self._proc.stdin.close()
        try:
            self._proc.wait(60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(10)
        self._proc = None
