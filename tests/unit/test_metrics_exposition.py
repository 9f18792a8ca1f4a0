"""The engine's metrics in both formats: the text format 0.0.4 as before, and OpenMetrics
(counters' families without `_total`, canonical `le`, a traced observation as its bucket's
exemplar), chosen by the first line a client sends on the metrics socket."""

from __future__ import annotations

import asyncio
from pathlib import Path

from zccp.observe.metrics import EngineMetrics, MetricsServer


def metrics() -> EngineMetrics:
    m = EngineMetrics()
    m.latency.for_model("m")
    m.latency.ttft_s.observe(0.003, (0xABC, 0xDEF))
    m.latency.ttft_s.observe(0.004)          # untraced: the bucket keeps the traced one's exemplar
    m.latency.ttft_s.observe(2.0)
    m.tokens_out.inc(1234567)
    return m


def test_the_text_format_has_no_exemplar() -> None:
    text = metrics().render()
    assert "# TYPE zccp_engine_completion_tokens_total counter\nzccp_engine_completion_tokens_total 1234567\n" in text
    assert 'gen_ai_server_time_to_first_token_seconds_bucket{gen_ai_request_model="m",le="0.005"} 2\n' in text
    assert 'le="1"} 2\n' in text and " # {" not in text and "# EOF" not in text


def test_openmetrics_names_families_and_carries_exemplars() -> None:
    text = metrics().render(True)
    assert "# TYPE zccp_engine_completion_tokens counter\nzccp_engine_completion_tokens_total 1234567\n" in text
    lines = [line for line in text.splitlines() if line.startswith("gen_ai_server_time_to_first_token_seconds_bucket")]
    traced = [line for line in lines if " # {" in line]
    assert len(traced) == 1
    sample, exemplar = traced[0].split(" # ")
    assert sample == 'gen_ai_server_time_to_first_token_seconds_bucket{gen_ai_request_model="m",le="0.005"} 2'
    labels, value, ts = exemplar.split(" ")
    assert labels == '{trace_id="00000000000000000000000000000abc",span_id="0000000000000def"}'
    assert float(value) == 0.003 and float(ts) > 1.7e9
    assert any(line.endswith('le="1.0"} 2') for line in lines) and not any('le="1"}' in line for line in lines)


def test_the_socket_answers_the_format_asked_for(tmp_path: Path) -> None:
    async def ask(path: str, line: bytes) -> str:
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(line)
        await writer.drain()
        data = await reader.read()
        writer.close()
        return data.decode()

    async def run() -> tuple[str, str, str]:
        server = MetricsServer(str(tmp_path / "engine.sock.metrics"), metrics())
        await server.start()
        try:
            return (await ask(server.path, b"openmetrics\n"), await ask(server.path, b"text\n"),
                    await ask(server.path, b"x" * 100_000))
        finally:
            await server.stop()

    om, text, too_long = asyncio.run(run())
    assert " # {trace_id=" in om and "# TYPE zccp_engine_rings counter" in om
    assert text == too_long      # a line past the reader's limit: the text format
    assert " # {" not in text and "# TYPE zccp_engine_rings_total counter" in text
