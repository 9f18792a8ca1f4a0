#!/usr/bin/env bash
# The README's first hour on a stock Debian 12, for real: a clean clone of this repository's
# HEAD (committed files only) in a fresh debian:bookworm-slim container, whose python3 is the
# system one and which has nothing else installed, then the README's two commands as written:
#   bash scripts/run-stack.sh   (then one message through the stack, and Ctrl-C)
#   bash scripts/test.sh
# Docker is installed and started if needed, the base image made with debootstrap if absent
# (scripts/lib/docker.sh). Run as root (or with sudo). Takes ~10 minutes.
#   ZCCP_CHECK_WALKTHROUGH=1  then also scripts/existing-nginx-walkthrough.sh (docs/existing-nginx.md
#                   run as written in another fresh container, removal included; ~7 more minutes)
#   ZCCP_CHECK_SHM  the container's /dev/shm (default 1g, as on a host: Docker's own default of
#                   64 MB is too small for the default 128 MiB arena, and the engine says so)
# This machine's pip settings travel in, as a user's would: its CA bundle (PIP_CERT, or pip's
# global.cert) and its find-links directory with the CPU torch wheel (PIP_FIND_LINKS, or
# global.find-links); TORCH_INDEX_URL is passed through to scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
LOG_DIR=$ROOT/.run/debian12-check
mkdir -p "$LOG_DIR"
T0=$(date +%s)
say() { printf '[debian12-check %4ds] %s\n' "$(($(date +%s) - T0))" "$*"; }

# shellcheck source=lib/docker.sh
. scripts/lib/docker.sh

WORK=$(mktemp -d)
cleanup() {
    local rc=$?
    set +e
    docker_down
    rm -rf "$WORK"
    say "$([ "$rc" -eq 0 ] && echo PASSED || echo "FAILED (logs: $LOG_DIR)")"
    exit "$rc"
}
trap cleanup EXIT

docker_up
debian_base_image
say "$(docker version --format 'docker {{.Server.Version}}'); image debian:bookworm-slim $(docker image ls debian:bookworm-slim --format '{{.ID}}')"

git clone -q --no-local "$ROOT" "$WORK/zccp"
say "clean clone of $(git rev-parse --short HEAD) ($(git -C "$WORK/zccp" ls-files | wc -l) files)"

MOUNTS=(-v "$WORK/zccp:/src:ro")
ENVS=()
container_pip_settings
[ -z "${TORCH_INDEX_URL:-}" ] || ENVS+=(-e "TORCH_INDEX_URL=$TORCH_INDEX_URL")

# Inside: a user's shell in their clone. Everything below the cp is what the README says.
INSIDE='
set -euo pipefail
say() { printf "[in the container] %s\n" "$*"; }
# The user cloned with git: git is there, and the clone is theirs.
apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq git >/dev/null
cp -a /src /root/zccp && cd /root/zccp
say "python3 is $(command -v python3 || echo missing) ($(python3 --version 2>&1 || true)); python: $(command -v python || echo none)"

bash scripts/run-stack.sh > /tmp/run-stack.log 2>&1 &
STACK=$!
for i in $(seq 1 900); do
    python3 -c "import urllib.request as u; u.urlopen(\"http://127.0.0.1:8080/health\", timeout=2)" 2>/dev/null && break
    kill -0 $STACK 2>/dev/null || { tail -40 /tmp/run-stack.log; exit 1; }
    sleep 1
done
say "run-stack.sh: up after ${i} s; python3 is now $(command -v python3) ($(python3 --version)), the venv is made from $(.venv/bin/python -c "import sys; print(sys.base_prefix)")/bin/python3"
python3 - <<PY
import json, urllib.request as u
req = u.Request("http://127.0.0.1:8080/v1/messages", method="POST", headers={"content-type": "application/json"},
                data=json.dumps({"model": "zccp-tiny", "max_tokens": 16,
                                 "messages": [{"role": "user", "content": "Hello"}]}).encode())
with u.urlopen(req, timeout=60) as r:
    m = json.load(r)
    assert r.status == 200 and m["type"] == "message", m
    print("[in the container] a message through the stack:", r.headers["X-Request-ID"], m["usage"])
PY
kill -INT $STACK; wait $STACK || true
tail -3 /tmp/run-stack.log
left=$(cat /proc/[0-9]*/cmdline 2>/dev/null | tr "\0" " " | grep -Eo "[n]ginx: master|[r]edis-server|[z]ccp.cli engine" || true)
[ -z "$left" ] || { say "the stack left processes behind: $left"; exit 1; }

say "test.sh"
bash scripts/test.sh -q -p no:cacheprovider 2>&1 | tail -15
'
say "docker run debian:bookworm-slim (log: $LOG_DIR/container.log)"
set +e
docker run --rm --shm-size "${ZCCP_CHECK_SHM:-1g}" "${MOUNTS[@]}" "${ENVS[@]}" debian:bookworm-slim \
    bash -c "$INSIDE" > "$LOG_DIR/container.log" 2>&1
rc=$?
set -e
grep -E '^\[in the container\]|passed|failed|error' "$LOG_DIR/container.log" | tail -25
if [ "$rc" -eq 0 ] && [ "${ZCCP_CHECK_WALKTHROUGH:-0}" = 1 ]; then
    say "existing-nginx-walkthrough.sh (docs/existing-nginx.md on a fresh Debian 12)"
    bash scripts/existing-nginx-walkthrough.sh || rc=$?
fi
exit $rc
