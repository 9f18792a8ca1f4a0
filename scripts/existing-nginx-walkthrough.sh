#!/usr/bin/env bash
# docs/existing-nginx.md executed to the letter on a fresh Debian 12: a clean clone of this
# repository's HEAD (committed files only) in a fresh debian:bookworm-slim container, an
# operator's own `listen 443 ssl http2` site with a self-signed certificate, then every
# fenced block of the page, read from the page itself, in its order: Install (steps 1-8),
# Verify over HTTPS + HTTP/2 with --cacert, Removal. Then it proves that the host is back:
# `nginx -T` byte for byte as before step 7, nginx restarts and serves the site, and no ZCCP
# process, socket, /dev/shm segment, file, user, group or Redis key is left.
#
#   bash scripts/existing-nginx-walkthrough.sh          run it (root or sudo; ~6-10 min; Docker
#                                                        is installed and started if needed, the
#                                                        base image made with debootstrap)
#   bash scripts/existing-nginx-walkthrough.sh --list   check the page's blocks against the
#                                                        plan below and print it (no Docker;
#                                                        tests/unit/test_existing_nginx_walkthrough.py)
#
# The page and this script cannot drift apart: the commands run are the page's own blocks,
# and the plan names each block by its language and first command; a block added, removed
# or reordered in the page fails --list (and so the unit test) until the plan says what
# to do with it. Substitutions (printed when run): `<this repository>` is the clean clone.
#
# No systemd runs in a container. `systemctl`, `journalctl` are stand-ins put first in PATH
# (/usr/local/sbin): the page's commands stay as written; `/sbin/runlevel` and an `/sbin/init`
# that is never run let invoke-rc.d act for the packages as on a host (a trigger reloads nginx). The stand-in
# starts nginx and redis-server with their Debian init scripts, and a unit of
# /etc/systemd/system (zccp-engine.service) from the unit file itself: its User=, Group=,
# Environment=, UMask=, RuntimeDirectory= (+Mode) and ExecStart=, output to a file that
# `journalctl -u UNIT` prints. Not emulated: the unit's sandboxing (ProtectSystem=,
# PrivateTmp=, ...), Restart=, boot ordering. `systemd-sysusers` is the real one (the
# systemd package is installed, as on any Debian 12 host; only its init is not running).
# Like scripts/debian12-check.sh, this machine's pip settings travel in (PIP_CERT or
# global.cert; PIP_FIND_LINKS or global.find-links with the CPU torch wheel).
set -euo pipefail
cd "$(dirname "$0")/.."
DOC=${WALK_DOC:-docs/existing-nginx.md}   # WALK_DOC: another copy of the page (the unit test)

# The plan: one entry per fenced block of the page, in order: LANG|FIRST WORDS|ACTION|why.
# ACTION: run (the block as written), site (the operator's server {} of step 7), skip, alt (one
# of two alternatives: the script runs the one this machine can, and says which).
PLAN=(
    "nginx|location /|skip|a catch-all for a server of ZCCP's own; here ZCCP joins the operator's servers"
    "sh|install -d /etc/zccp|run|step 1"
    "sh|git clone <this|run|step 2 (<this repository>: the clean clone)"
    "sh|/opt/zccp/.venv/bin/pip install --index-url|alt|step 2, torch from PyTorch's CPU index (where it answers)"
    "sh|/opt/zccp/.venv/bin/pip install --find-links /root/wheels|alt|step 2, torch from a copied wheel (where the index does not answer)"
    "sh|/opt/zccp/.venv/bin/pip install /opt/zccp|run|step 2, ZCCP and vendor-lua"
    "sh|install -D -m|run|step 3"
    "sh|install -d /etc/zccp|run|step 4"
    "sh|systemctl enable --now|run|step 5"
    "sh|/opt/zccp/.venv/bin/zccp-nginx render --config|run|step 6"
    "sh|echo 'include /etc/nginx/zccp/zccp_http.conf;'|run|step 7, conf.d/zccp.conf"
    "sh|printf 'server {\n|run|step 7, conf.d/zccp-admin.conf"
    "nginx|server {|site|step 7, the include and the access_log lines in both operator servers"
    "sh|/opt/zccp/.venv/bin/zccp-nginx check --config|run|step 8"
    "sh|curl -s http://127.0.0.1/zccp/health|skip|Verify on a plain listen 80 server; this operator's API servers are TLS-only"
    "sh|curl -s --http2|run|Verify over HTTPS + HTTP/2, --cacert"
    "sh|curl -s --unix-socket|run|Verify, both"
    "sh|rm /etc/nginx/conf.d/zccp.conf|run|Removal"
    "sh|apt-get purge -s|run|Removal, the packages"
)

# Every fenced block of the page into DIR/NN.LANG, its list indentation taken off.
extract_blocks() {
    awk -v dir="$2" '
        !inb && match($0, /^ *```[a-z]+$/) { inb = 1; n++; ind = index($0, "`") - 1
            lang = substr($0, ind + 4); file = sprintf("%s/%02d.%s", dir, n, lang); printf "" > file; next }
        inb && $0 ~ /^ *```$/ { inb = 0; close(file); next }
        inb { line = $0; if (substr(line, 1, ind) ~ /^ *$/) line = substr(line, ind + 1); print line > file }
    ' "$1"
}

# The page's blocks against the plan: same count, each one's language and first command.
check_plan() {
    local dir=$1 i=0 f lang want first
    local files=("$dir"/*)
    if [ "${#files[@]}" -ne "${#PLAN[@]}" ]; then
        echo "walkthrough: $DOC has ${#files[@]} fenced blocks, the plan ${#PLAN[@]}: update PLAN in $0" >&2
        return 1
    fi
    for f in "${files[@]}"; do
        IFS='|' read -r lang want _ <<<"${PLAN[$i]}"
        first=$(grep -v -e '^ *#' -e '^ *$' "$f" | head -1)
        if [ "${f##*.}" != "$lang" ] || [ "${first#"$want"}" = "$first" ]; then
            echo "walkthrough: block $((i + 1)) of $DOC is ${f##*.} '$first'; the plan expects $lang '$want...'" >&2
            return 1
        fi
        i=$((i + 1))
    done
}

if [ "${1:-}" = "--list" ]; then
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    extract_blocks "$DOC" "$tmp"
    check_plan "$tmp"
    for i in "${!PLAN[@]}"; do
        IFS='|' read -r lang want action why <<<"${PLAN[$i]}"
        printf '%2d %-5s %-4s %s  (%s)\n' $((i + 1)) "$lang" "$action" "$want" "$why"
    done
    exit 0
fi

if [ "${1:-}" = "--inside" ]; then
    # shellcheck source=existing-nginx-inside.sh
    . scripts/existing-nginx-inside.sh
    exit 0
fi

ROOT=$PWD
LOG_DIR=$ROOT/.run/existing-nginx-walkthrough
mkdir -p "$LOG_DIR"
T0=$(date +%s)
say() { printf '[walkthrough %4ds] %s\n' "$(($(date +%s) - T0))" "$*"; }
tmp=$(mktemp -d)
extract_blocks "$DOC" "$tmp"
check_plan "$tmp"
rm -rf "$tmp"

# shellcheck source=lib/docker.sh
. scripts/lib/docker.sh
WORK=$(mktemp -d)
cleanup() {
    local rc=$?
    set +e
    docker_down
    rm -rf "$WORK"
    say "$([ "$rc" -eq 0 ] && echo PASSED || echo "FAILED (log: $LOG_DIR/container.log)")"
    exit "$rc"
}
trap cleanup EXIT
docker_up
debian_base_image
git clone -q --no-local "$ROOT" "$WORK/zccp"
say "clean clone of $(git rev-parse --short HEAD); image debian:bookworm-slim $(docker image ls debian:bookworm-slim --format '{{.ID}}')"

MOUNTS=(-v "$WORK/zccp:/src:ro")
ENVS=()
container_pip_settings
if ! curl -s -m 10 -o /dev/null https://download.pytorch.org/whl/cpu/; then
    ENVS+=(-e WALK_NO_TORCH_INDEX=1)
fi
say "docker run debian:bookworm-slim (log: $LOG_DIR/container.log)"
set +e
docker run --rm --shm-size 1g "${MOUNTS[@]}" "${ENVS[@]}" -e PIP_RETRIES=1 -e PIP_TIMEOUT=20 \
    debian:bookworm-slim bash -c 'cd /src && bash scripts/existing-nginx-walkthrough.sh --inside' \
    > "$LOG_DIR/container.log" 2>&1
rc=$?
set -e
grep -E '^\[(inside|FAIL)' "$LOG_DIR/container.log" | tail -40
exit $rc
