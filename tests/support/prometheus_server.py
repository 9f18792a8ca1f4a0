"""A real Prometheus (Debian's `prometheus` package) for the tests: it scrapes a live stack's
admin listener over loopback TCP with the admin token, evaluates the shipped rules, and
answers PromQL over its HTTP API."""

from __future__ import annotations

import math
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.checkout import REPO
from zccp.ops.stack import free_port

RULES = REPO / "deploy" / "prometheus" / "zccp-rules.yml"


def have_prometheus() -> bool:
    return shutil.which("prometheus") is not None and shutil.which("promtool") is not None


@dataclass
class Prometheus:
    run_dir: Path
    target: str                      # host:port of the admin listener
    token_file: Path
    port: int = field(default_factory=free_port)
    features: tuple[str, ...] = ()   # --enable-feature=... (exemplar-storage: it keeps exemplars)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Prometheus:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        cfg = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{
                "job_name": "zccp",
                "authorization": {"type": "Bearer", "credentials_file": str(self.token_file)},
                "static_configs": [{"targets": [self.target]}],
            }],
        }
        path = self.run_dir / "prometheus.yml"
        path.write_text(yaml.safe_dump(cfg))
        log = (self.run_dir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={path}", f"--storage.tsdb.path={self.run_dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}",
             *(f"--enable-feature={f}" for f in self.features)], stdout=log, stderr=subprocess.STDOUT)
        end = time.monotonic() + 60
        while time.monotonic() < end:
            assert self.proc.poll() is None, (self.run_dir / "prometheus.log").read_text()[-3000:]
            try:
                if httpx.get(self.url + "/-/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("prometheus never became ready")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def api(self, path: str, **params: str) -> Any:
        r = httpx.get(self.url + "/api/v1/" + path, params=params, timeout=10)
        body = r.json()
        assert body.get("status") == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant vector; only its samples with a finite value (a quantile over no increase is NaN)."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return [s for s in data["result"] if math.isfinite(float(s["value"][1]))]

    def exemplars(self, expr: str, window_s: float = 600) -> list[dict[str, Any]]:
        """/api/v1/query_exemplars over the last window_s: per series, its exemplars
        ({labels, value, timestamp})."""
        now = time.time()
        data = self.api("query_exemplars", query=expr, start=str(now - window_s), end=str(now + 60))
        assert isinstance(data, list), data
        return data
