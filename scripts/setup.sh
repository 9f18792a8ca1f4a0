#!/usr/bin/env bash
# Installs what ZCCP needs on Debian 12: nginx + the Lua module, redis, and the
# Python package with its dependencies. Idempotent: skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(nginx libnginx-mod-http-lua lua-resty-core lua-resty-lrucache lua-cjson redis-server luajit2 wrk)
missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "setup: apt-get install ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
# The CPU build of torch (a plain `torch` requirement would fetch a multi-GB CUDA build).
"$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install -q "torch==2.13.0"
"$PY" -m pip install -q -e ".[test]"
echo "setup: done"
