"""Latency histograms on /metrics: the OpenTelemetry GenAI server metrics as Prometheus
histograms (time to first token, time per output token, request duration by cache result),
the engine's queue wait and prefill, and nginx's time per phase; through both APIs,
streamed and not, a miss and a hit."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cache_requests import MODEL, PATHS, req, stored
from tests.support.harness import Stack
from tests.support.prom_text import histograms

ENGINE_FAMILIES = ("gen_ai_server_time_to_first_token_seconds", "gen_ai_server_time_per_output_token_seconds",
                   "zccp_engine_queue_wait_seconds", "zccp_engine_prefill_seconds")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    s = Stack(tmp_path_factory.mktemp("latency"), with_redis=True).start()
    yield s
    s.stop()


def scrape(s: Stack) -> str:
    r = s.admin_client().get("/metrics")
    assert r.status_code == 200
    return r.text


def answered(text: str) -> float:
    """The duration histogram's count over every cache result but HIT."""
    duration = histograms(text, "gen_ai_server_request_duration_seconds")
    return sum(v["count"] for k, v in duration.items() if ("cache", "HIT") not in k)   # type: ignore[misc]


def test_generated_requests_fill_the_engine_histograms(stack: Stack) -> None:
    model = (("gen_ai_request_model", MODEL),)
    text = scrape(stack)
    before = {f: histograms(text, f).get(model, {}).get("count", 0.0) for f in ENGINE_FAMILIES}
    answered_before = answered(text)
    with stack.client() as c:
        for api in ("anthropic", "openai"):
            for stream in (False, True):
                body = req(api, [{"role": "user", "content": f"latency {api} {stream}"}], max_tokens=8,
                           stream=stream)
                r = c.post(PATHS[api], json=body, headers={"cache-control": "no-store"})
                assert r.status_code == 200, r.text
    text = scrape(stack)
    for family in ENGINE_FAMILIES:
        s = histograms(text, family)[model]
        assert s["count"] == before[family] + 4, family
        assert s["sum"] > 0, family
    assert answered(text) == answered_before + 4
    # the first tokens came within the requests' durations
    ttft = histograms(text, "gen_ai_server_time_to_first_token_seconds")[model]
    duration = histograms(text, "gen_ai_server_request_duration_seconds")
    assert ttft["sum"] <= sum(v["sum"] for v in duration.values())   # type: ignore[misc]


def test_a_cache_hit_is_in_the_duration_histogram_by_its_result(stack: Stack) -> None:
    body = req("anthropic", [{"role": "user", "content": "a hit for the histogram"}], max_tokens=6)
    stored(stack, "anthropic", body)
    hits = histograms(scrape(stack), "gen_ai_server_request_duration_seconds")
    key = (("cache", "HIT"), ("gen_ai_request_model", MODEL))
    assert hits[key]["count"] >= 1


def test_nginx_phase_histogram_has_every_phase(stack: Stack) -> None:
    with stack.client() as c:
        body = req("openai", [{"role": "user", "content": "phases"}], max_tokens=4)
        assert c.post(PATHS["openai"], json=body).status_code == 200
    phases = histograms(scrape(stack), "zccp_nginx_phase_seconds")
    for phase in ("admit", "engine", "total"):
        s = phases[(("api", "openai"), ("phase", phase))]
        assert s["count"] >= 1, phase
    admit = phases[(("api", "openai"), ("phase", "admit"))]
    assert 0 < admit["sum"] < 60


def test_exposition_names_every_family_once(stack: Stack, tmp_path: Path) -> None:
    text = scrape(stack)
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types)), "a family's TYPE line twice"
