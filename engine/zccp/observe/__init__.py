"""Metrics, JSON logs and request traces (the span process: python -m zccp.observe.trace_spans)."""
