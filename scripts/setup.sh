#!/usr/bin/env bash
# Installs what ZCCP needs on Debian 12 and makes the checkout's own virtual environment:
# nginx + the Lua module and libraries, redis, luajit and wrk from apt (Debian's Redis and DNS
# Lua clients unpacked into lua-vendor/, not installed: docs/libraries.md); the Python package and its
# dependencies into .venv/ (never into the system Python: Debian's python3 refuses that,
# PEP 668, and a per-checkout venv keeps two clones from breaking each other).
# Idempotent: skips what is already there. Environment:
#   PYTHON            the interpreter the venv is made from (default: python3)
#   TORCH_INDEX_URL   where pip takes torch from, e.g. https://download.pytorch.org/whl/cpu
#                     for the CPU build (~200 MB). Unset, pip uses its configured indexes:
#                     from PyPI that is the CUDA build of torch 2.13.0 (~900 MB, plus ~3 GB of
#                     NVIDIA libraries it pulls in); where pip is configured with a local
#                     find-links holding the CPU wheel (this project's CI machines), that one.
set -euo pipefail
cd "$(dirname "$0")/.."

# Not lua-nginx-redis, -redis-connector, -dns (lua-resty-redis, its Sentinel connector,
# lua-resty-dns): their packages depend on nginx-extras (nineteen more nginx modules); their
# Lua files are unpacked into lua-vendor/ below instead (docs/libraries.md).
# redis-sentinel: the Sentinel failover tests.
# systemd: only for `systemd-analyze verify` of deploy/systemd/ in the tests (nothing is started)
# prometheus: the real server and promtool that scrape a live stack in the tests
# (tests/integration/test_prometheus.py; its service is not started by the package here)
APT_PACKAGES=(nginx libnginx-mod-http-lua lua-resty-core lua-resty-lrucache lua-cjson
              redis-server redis-sentinel luajit2 wrk lua-check
              python3 python3-venv systemd prometheus)
missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "setup: apt-get install ${missing[*]}"
    $SUDO apt-get update -qq
    # The packages start, stop and reload no service (a running nginx is left as it is: the
    # Lua module's package would reload it), as docs/existing-nginx.md's step 1; a host's own
    # policy-rc.d, if there is one, decides instead.
    policy=/usr/sbin/policy-rc.d
    own_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
        $SUDO chmod 0755 "$policy"
        own_policy=1
        trap '$SUDO rm -f "$policy"' EXIT
    fi
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
    if [ "$own_policy" = 1 ]; then
        $SUDO rm -f "$policy"
        trap - EXIT
    fi
fi

VENV=.venv
if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV"
    "${PYTHON:-python3}" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip -q --disable-pip-version-check)
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    echo "setup: installing torch 2.13.0${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL} (see the top of this script for its size)"
    "${PIP[@]}" install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==2.13.0"
fi
# Editable: the venv runs this checkout's code, and only this checkout's. The hf extra
# (transformers, tokenizers) is installed because the tests run the hf backend.
"${PIP[@]}" install -e ".[test,hf,lint,otel]"
# Debian's lua-resty-redis, connector and dns, without their packages' nginx-extras: their
# Lua files from the .debs into lua-vendor/, on the rendered lua_package_path
if ! "$VENV/bin/zccp-nginx" vendor-lua --check >/dev/null 2>&1; then
    echo "setup: zccp-nginx vendor-lua (lua-vendor/)"
    "$VENV/bin/zccp-nginx" vendor-lua >/dev/null
fi
echo "setup: done ($VENV)"
