"""model.backend: upstream: an OpenAI- or Anthropic-compatible HTTP server answers the
engine's misses (docs/upstreams.md). `wire` (bodies and stream readers of both APIs),
`client` (pooled HTTP, fallback list, retries, health), `reply` (the answer into the
slot through the client's codec), `backend` (the model slot it fills)."""
