"""A real Prometheus scrapes a live stack (the admin listener on loopback TCP, with the admin
token): the latency histograms are in its store, the shipped rules pass promtool and
evaluate to data, and every query of the shipped Grafana dashboard returns data. The stack
traces its requests (to a test OTLP receiver) and Prometheus keeps exemplars: it scrapes
OpenMetrics, whose latency buckets carry the trace of a request the test sent; the text
format, what other scrapers get, passes `promtool check metrics`."""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.cache_requests import PATHS, req
from tests.support.checkout import REPO
from tests.support.harness import Stack
from tests.support.otlp_receiver import receiving, OtlpReceiver
from tests.support.prometheus_server import RULES, Prometheus, have_prometheus
from zccp.ops.stack import free_port

pytestmark = pytest.mark.skipif(not have_prometheus(),
                                reason="prometheus and promtool (scripts/setup.sh) not installed")

DASHBOARD = REPO / "deploy" / "grafana" / "zccp-dashboard.json"
TOKEN = "prometheus-scrape-token-0123456789abcdef"
# Grafana's variables as the test resolves them: every model, a window that holds several scrapes
VARIABLES = {"$model": ".+", "$__rate_interval": "1m"}


OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


@pytest.fixture(scope="module")
def rx() -> Iterator[OtlpReceiver]:
    with receiving() as r:
        yield r


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory, rx: OtlpReceiver) -> Iterator[tuple[Stack, Prometheus]]:
    tmp = tmp_path_factory.mktemp("prometheus")
    token = tmp / "admin.token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    admin = f"127.0.0.1:{free_port()}"
    s = Stack(tmp / "stack", {"server": {"admin_listen": admin, "admin_token_file": str(token)},
                              "tracing": {"enabled": True, "endpoint": rx.url + "/v1/traces"}},
              with_redis=True).start()
    prom = Prometheus(tmp / "prom", admin, token, features=("exemplar-storage",))
    try:
        prom.start()
        traffic_until_scraped(s, prom)
        yield s, prom
    finally:
        prom.stop()
        s.stop()


def send_some(s: Stack, n: int) -> None:
    with s.client() as c:
        for api in ("anthropic", "openai"):
            for stream in (False, True):
                body = req(api, [{"role": "user", "content": f"scrape me {n} {stream}"}], max_tokens=6, stream=stream)
                assert c.post(PATHS[api], json=body).status_code == 200
            # the last round's body again: the engine's hit from Redis (later ones: nginx's L1)
            for k in (n - 1, n):
                body = req(api, [{"role": "user", "content": f"stored {k}"}], max_tokens=6)
                assert c.post(PATHS[api], json=body).status_code == 200


def traffic_until_scraped(s: Stack, prom: Prometheus) -> None:
    """Requests between scrapes until the rates over them are above 0 (at most 90 s)."""
    end = time.monotonic() + 90
    n = 0
    while time.monotonic() < end:
        send_some(s, n)
        n += 1
        time.sleep(0.5)
        if n >= 6 and prom.query("zccp:gen_ai_server_time_to_first_token_seconds:p95_5m") \
                and prom.query('zccp:gen_ai_server_request_duration_seconds:p95_5m{cache="HIT"}'):
            send_some(s, n)
            time.sleep(2.5)   # one more scrape and rule evaluation after the last requests
            return
    raise AssertionError("prometheus never had the stack's latency data")


def test_promtool_checks_the_shipped_rules() -> None:
    r = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_prometheus_scrapes_the_histograms(scraped: tuple[Stack, Prometheus]) -> None:
    _, prom = scraped
    targets = prom.api("targets")["activeTargets"]
    assert [t["health"] for t in targets] == ["up"], targets
    for family in ("gen_ai_server_time_to_first_token_seconds", "gen_ai_server_time_per_output_token_seconds",
                   "gen_ai_server_request_duration_seconds", "zccp_engine_queue_wait_seconds",
                   "zccp_engine_prefill_seconds", "zccp_nginx_phase_seconds"):
        got = prom.query(f"sum({family}_count)")
        assert got and float(got[0]["value"][1]) > 0, family
        assert prom.query(f'{family}_bucket{{le="+Inf"}}'), family


def test_every_recording_rule_evaluates_to_data(scraped: tuple[Stack, Prometheus]) -> None:
    _, prom = scraped
    groups = prom.api("rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert rules, "no rules loaded"
    for r in rules:
        assert r["health"] == "ok", r
    records = [r["name"] for r in rules if r["type"] == "recording"]
    assert len(records) >= 8
    for name in records:
        assert prom.query(name), f"recording rule {name} has no data"
    alerts = {r["name"] for r in rules if r["type"] == "alerting"}
    assert {"ZccpEngineDown", "ZccpServerErrors", "ZccpSlowFirstToken", "ZccpQueueBacklog"} <= alerts
    # a healthy stack fires none of them
    assert all(r["state"] == "inactive" for r in rules if r["type"] == "alerting")


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in VARIABLES.items():
                expr = expr.replace(var, value)
            assert "$" not in expr, f"{panel['title']}: a variable the test does not resolve: {expr}"
            out.append((panel["title"], expr))
    return out


def test_every_dashboard_panel_has_data(scraped: tuple[Stack, Prometheus]) -> None:
    _, prom = scraped
    dashboard = json.loads(DASHBOARD.read_text())
    queries = panel_queries(dashboard)
    assert len(queries) >= len(dashboard["panels"]) >= 8
    empty = [(title, expr) for title, expr in queries if not prom.query(expr)]
    assert not empty, f"panels without data: {empty}"
    # the model variable's own query names the stack's model
    values = prom.api("label/gen_ai_request_model/values")
    assert "zccp-tiny" in values


def test_the_text_format_passes_promtool_and_openmetrics_is_asked_for(scraped: tuple[Stack, Prometheus]) -> None:
    s, _ = scraped
    with s.admin_client() as c:
        text = c.get("/metrics")
        om = c.get("/metrics", headers={"accept": "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"})
        prefers_text = c.get("/metrics", headers={"accept": "text/plain, application/openmetrics-text;q=0.5"})
    assert text.headers["content-type"] == prefers_text.headers["content-type"] == "text/plain; version=0.0.4"
    r = subprocess.run(["promtool", "check", "metrics"], input=text.text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "# EOF" not in text.text and " # {" not in text.text
    assert "# TYPE zccp_engine_rings_total counter" in text.text
    # OpenMetrics: a counter's family without `_total`, canonical `le`, one `# EOF` at the end
    assert om.headers["content-type"] == OPENMETRICS
    assert om.text.endswith("\n# EOF\n") and om.text.count("# EOF") == 1 and "\n\n" not in om.text
    assert "# TYPE zccp_engine_rings counter\nzccp_engine_rings_total " in om.text
    assert "# TYPE zccp_nginx_requests counter\n" in om.text
    assert 'le="1.0"}' in om.text and 'le="1"}' not in om.text


def test_a_latency_bucket_carries_the_trace_of_a_request(scraped: tuple[Stack, Prometheus], rx: OtlpReceiver) -> None:
    s, prom = scraped
    assert [t["health"] for t in prom.api("targets")["activeTargets"]] == ["up"]   # OpenMetrics parsed
    tid, parent = secrets.token_hex(16), secrets.token_hex(8)
    body = req("openai", [{"role": "user", "content": "an exemplar to find"}], max_tokens=6)
    r = s.client().post(PATHS["openai"], json=body, headers={"traceparent": f"00-{tid}-{parent}-01"})
    assert r.status_code == 200
    spans = rx.wait_for(lambda got: any(x.trace_id == tid and x.parent_span_id == parent for x in got))
    root = next(x for x in spans if x.trace_id == tid and x.parent_span_id == parent)
    for family in ("gen_ai_server_time_to_first_token_seconds", "gen_ai_server_request_duration_seconds"):
        found: list[dict[str, Any]] = []
        end = time.monotonic() + 60
        while not found and time.monotonic() < end:
            found = [e for series in prom.exemplars(f"{family}_bucket") for e in series["exemplars"]
                     if e["labels"].get("trace_id") == tid]
            time.sleep(0.5)
        assert found, f"{family}: no exemplar of trace {tid} in Prometheus"
        # the request's own span: the root the OTLP receiver got
        assert {e["labels"]["span_id"] for e in found} == {root.span_id}
        assert all(float(e["value"]) > 0 for e in found)
