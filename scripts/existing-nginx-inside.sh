# The container's half of scripts/existing-nginx-walkthrough.sh (sourced there with --inside;
# it defines extract_blocks, check_plan and PLAN). Runs as root in a fresh debian:bookworm-slim,
# in /src, a read-only clean clone. Every command of docs/existing-nginx.md runs from the
# page's own blocks; what this file adds is the operator's side (their site before ZCCP,
# their edits, the page's comments done as they say) and the checks.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
W=/root/walk
mkdir -p "$W/blocks" "$W/out" "$W/before"
T0=$(date +%s)
say() { printf '[inside %4ds] %s\n' "$(($(date +%s) - T0))" "$*"; }
fail() {
    printf '[FAIL] %s\n' "$*"
    [ ! -f /var/log/nginx/error.log ] || { echo "--- error.log:"; tail -20 /var/log/nginx/error.log; }
    exit 1
}
extract_blocks "$DOC" "$W/blocks"
check_plan "$W/blocks"
BLOCKS=("$W/blocks"/*)

# What any Debian 12 host has before step 1 and minbase lacks: systemd's tools (not its
# init), passwd, procps, curl, openssl, CA certificates.
apt-get update -qq
apt-get install -y -qq systemd passwd procps curl openssl ca-certificates >/dev/null
say "base: $(. /etc/os-release; echo "$PRETTY_NAME"), systemd $(dpkg-query -W -f '${Version}' systemd) (tools only: PID 1 is $(cat /proc/1/comm))"

# --- the stand-ins for systemctl and journalctl (see the top of existing-nginx-walkthrough.sh)
cat > /usr/local/sbin/systemctl <<'SH'
#!/bin/bash
# systemctl stand-in for scripts/existing-nginx-walkthrough.sh (no systemd in a container):
# /etc/systemd/system units from their own User=, Group=, Environment=, UMask=,
# RuntimeDirectory=(Mode) and ExecStart=; other units through /etc/init.d.
set -euo pipefail
LOGS=/var/log/walkthrough-journal RUN=/run/walkthrough-units
mkdir -p "$LOGS" "$RUN"
verb="" now=0 units=()
for a in "$@"; do
    case $a in --now) now=1 ;; -*) ;; *) if [ -z "$verb" ]; then verb=$a; else units+=("${a%.service}"); fi ;; esac
done
unit() { echo "/etc/systemd/system/$1.service"; }
# An init script's daemon (nginx's master keeps its stderr) must not hold the caller's pipe
# open: its output goes through a file, printed afterwards.
initd() {
    local out rc=0; out=$(mktemp)
    "/etc/init.d/$1" "$2" > "$out" 2>&1 < /dev/null || rc=$?
    cat "$out"; rm -f "$out"
    return $rc
}
key() { sed -n "s/^$2=//p" "$(unit "$1")" | tail -1; }
running() { [ -s "$RUN/$1.pid" ] && kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null; }
start() {
    if [ -f "$(unit "$1")" ]; then
        running "$1" && return 0
        local user group rd mode mask env=()
        user=$(key "$1" User); group=$(key "$1" Group); rd=$(key "$1" RuntimeDirectory)
        mode=$(key "$1" RuntimeDirectoryMode); mask=$(key "$1" UMask)
        user=${user:-root}; group=${group:-root}
        if [ -n "$rd" ]; then
            install -d -o "$user" -g "$group" "/run/$rd"; chmod "${mode:-0755}" "/run/$rd"
        fi
        while IFS= read -r e; do env+=("$e"); done < <(sed -n 's/^Environment=//p' "$(unit "$1")")
        # shellcheck disable=SC2046
        (cd / && umask "${mask:-0022}" && exec setsid setpriv --reuid="$user" --regid="$group" \
            --init-groups env "${env[@]}" $(key "$1" ExecStart)) >> "$LOGS/$1.log" 2>&1 < /dev/null &
        echo $! > "$RUN/$1.pid"
    elif [ -x "/etc/init.d/$1" ]; then
        "/etc/init.d/$1" status >/dev/null 2>&1 || initd "$1" start
    else
        echo "systemctl (stand-in): Unit $1.service not found." >&2; exit 5
    fi
}
stop() {
    if [ -f "$RUN/$1.pid" ]; then
        local pid i; pid=$(cat "$RUN/$1.pid")
        kill -TERM "$pid" 2>/dev/null || true
        for i in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        rm -f "$RUN/$1.pid"
    elif [ -x "/etc/init.d/$1" ]; then
        initd "$1" stop
    fi
}
case $verb in
    daemon-reload) ;;
    enable) [ "$now" = 0 ] || for u in "${units[@]}"; do start "$u"; done ;;
    disable) [ "$now" = 0 ] || for u in "${units[@]}"; do stop "$u"; done ;;
    start) for u in "${units[@]}"; do start "$u"; done ;;
    stop) for u in "${units[@]}"; do stop "$u"; done ;;
    reload|restart) for u in "${units[@]}"; do
                        if [ -x "/etc/init.d/$u" ]; then initd "$u" "$verb"; else stop "$u"; start "$u"; fi
                    done ;;
    status|is-active) for u in "${units[@]}"; do
                          if running "$u" || { [ -x "/etc/init.d/$u" ] && "/etc/init.d/$u" status >/dev/null 2>&1; }
                          then echo active; else echo inactive; exit 3; fi
                      done ;;
    *) echo "systemctl (stand-in): $verb is not emulated" >&2; exit 1 ;;
esac
SH
cat > /usr/local/sbin/journalctl <<'SH'
#!/bin/bash
# journalctl stand-in for scripts/existing-nginx-walkthrough.sh: -u UNIT prints what the
# systemctl stand-in captured of that unit's output (-f follows it; other flags are ignored).
u="" f=0
while [ $# -gt 0 ]; do case $1 in -u) u=${2%.service}; shift ;; -f) f=1 ;; esac; shift; done
log=/var/log/walkthrough-journal/$u.log
touch "$log"
if [ "$f" = 1 ]; then exec tail -n +1 -F "$log"; else cat "$log"; fi
SH
chmod 0755 /usr/local/sbin/systemctl /usr/local/sbin/journalctl
[ "$(command -v systemctl)" = /usr/local/sbin/systemctl ] || fail "the systemctl stand-in is not first in PATH"

run_block() {   # NUMBER [FILE]: one of the page's blocks, as written, stopping at the first failure
    local n=$1 f=${2:-${BLOCKS[$(($1 - 1))]}}
    IFS='|' read -r _ _ _ why <<<"${PLAN[$(($1 - 1))]}"
    say "block $n ($why): $(grep -v -e '^ *#' -e '^ *$' "$f" | head -1)"
    bash -euo pipefail -x "$f" 2>&1 | tee "$W/out/$n.txt" || fail "block $n of $DOC failed: $(tail -5 "$W/out/$n.txt")"
    echo   # a block's last output line may lack its newline (curl)
}
expect() {   # NUMBER TEXT: the block's output holds TEXT
    grep -qF -- "$2" "$W/out/$1.txt" || fail "block $1's output lacks '$2'"
}

# --- step 1, then the operator's own site, as it was before ZCCP: TLS only, self-signed
run_block 2
SITE_BLOCK=${BLOCKS[9]}
ZCCP_SPAN='/include \/etc\/nginx\/zccp\/zccp_server.conf;/,/access_log \/var\/log\/nginx\/zccp.log/'
# the operator's edit of Removal: the include, the comment and the access_log lines, and the
# blank line before them
without_zccp() { awk -v re1='include /etc/nginx/zccp/zccp_server.conf;' -v re2='access_log /var/log/nginx/zccp.log' '
    index($0, re1) { drop = 1; if (held) held = 0 }
    !drop { if (held) print ""; held = 0; if ($0 ~ /^ *$/) held = 1; else print; next }
    drop && index($0, re2) { drop = 0 }
    END { if (held) print "" }' "$1"; }
operator_root() { sed 's|^\( *\)# \.\.\. your root.*|&\n\1root /var/www/example;|' "$1"; }
install -d -m 0710 /etc/ssl/private
openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj /CN=your.host -addext subjectAltName=DNS:your.host \
    -keyout /etc/ssl/private/example.key -out /etc/ssl/certs/example.pem 2>/dev/null
echo '127.0.0.1 your.host' >> /etc/hosts
install -d /var/www/example
echo "the operator's own site" > /var/www/example/index.html
operator_root "$SITE_BLOCK" > "$W/site-with-zccp"
without_zccp "$W/site-with-zccp" > /etc/nginx/sites-enabled/example
grep -q 'zccp' /etc/nginx/sites-enabled/example && fail "the operator's site still names zccp: $(cat /etc/nginx/sites-enabled/example)"
nginx -t 2>/dev/null || fail "the operator's site: $(nginx -t 2>&1)"
systemctl start nginx && systemctl reload nginx
site_ok() { curl -sf --http2 --cacert /etc/ssl/certs/example.pem https://your.host/ | grep -qx "the operator's own site"; }
for _ in $(seq 1 50); do site_ok && break; sleep 0.2; done
site_ok || fail "the operator's site does not answer over https"
say "the operator's site answers: https://your.host/ over HTTP/2, $(curl -s -o /dev/null -w '%{http_version}' --http2 --cacert /etc/ssl/certs/example.pem https://your.host/)"

# --- steps 2-6
sed 's|<this repository>|/src|' "${BLOCKS[2]}" > "$W/block3.sh"
if [ -n "${WALK_NO_TORCH_INDEX:-}" ]; then
    # download.pytorch.org cannot be reached from here: the CPU wheel comes from pip's find-links
    say "substituted: no --index-url for torch (download.pytorch.org unreachable; the CPU wheel from PIP_FIND_LINKS)"
    sed -i 's|--index-url https://download.pytorch.org/whl/cpu ||' "$W/block3.sh"
fi
run_block 3 "$W/block3.sh"
[ -e /etc/sysusers.d ] && SYSUSERS_D_BEFORE=1 || SYSUSERS_D_BEFORE=0
for f in passwd group shadow gshadow; do cp "/etc/$f" "$W/before/$f"; done
run_block 4
expect 4 "zccp:x:"
run_block 5
run_block 6
expect 6 "/run/zccp/doorbell.sock"
redis-cli set operator:own stays >/dev/null          # the operator's own key in the Redis that stays
run_block 7
[ "$(stat -c '%U:%G %a' /var/log/nginx/zccp.log)" = "www-data:adm 640" ] \
    || fail "zccp.log is $(stat -c '%U:%G %a' /var/log/nginx/zccp.log), not www-data:adm 640"
nginx -T 2>/dev/null > "$W/before/nginx-T"          # the configuration before step 7

# --- steps 7-8
run_block 8
run_block 9
cp "$W/site-with-zccp" /etc/nginx/sites-enabled/example
say "block 10 (step 7): the include and the two access_log lines, in /etc/nginx/sites-enabled/example"
run_block 11
# A reload is asynchronous: the old workers answer until the new ones run. An operator types
# the next command seconds later; the script waits for the new workers' answer instead.
for _ in $(seq 1 150); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' --cacert /etc/ssl/certs/example.pem https://your.host/health)" = 404 ] || break
    sleep 0.2
done

# --- Verify over HTTPS + HTTP/2 (--cacert), and both
run_block 13
expect 13 '"status":"ok"'
expect 13 '"type":"message"'
expect 13 '"chat.completion"'
run_block 14
expect 14 "zccp_engine_up 1"
ps -o supgrp= -C nginx | grep -q zccp || fail "no nginx process has the group zccp"
# nginx's own 413, a body never read: the request id stands in for the context id
head -c 700000 /dev/zero | tr '\0' ' ' > "$W/big.json"
code=$(curl -s -o /dev/null -w '%{http_code}' --http2 --cacert /etc/ssl/certs/example.pem -H 'x-request-id: walk-413' \
       -H 'content-type: application/json' --data-binary @"$W/big.json" https://your.host/v1/messages)
[ "$code" = 413 ] || fail "a 700 KB body: $code, not 413"
grep -q '"request_id":"walk-413","context_id":"walk-413"' /var/log/nginx/zccp.log \
    || fail "zccp.log has no 413 line with the request id as context id: $(tail -3 /var/log/nginx/zccp.log)"
# a cacheable answer (temperature 0: not sampled), so that Removal has cache keys to delete
curl -s --http2 --cacert /etc/ssl/certs/example.pem https://your.host/v1/messages -H 'content-type: application/json' \
    -d '{"model":"zccp-tiny","max_tokens":8,"temperature":0,"messages":[{"role":"user","content":"cache me"}]}' >/dev/null
for _ in $(seq 1 50); do [ -z "$(redis-cli --scan --pattern 'zccp:*')" ] || break; sleep 0.2; done
[ -n "$(redis-cli --scan --pattern 'zccp:*')" ] || fail "no zccp:* key in Redis after a cacheable answer"
say "Redis holds $(redis-cli --scan --pattern 'zccp:*' | wc -l) zccp:* key(s) before Removal"
grep -q '"status":200.*"cache"' /var/log/nginx/zccp.log || fail "zccp.log has no answer: $(cat /var/log/nginx/zccp.log)"
say "verified: health, both APIs over HTTP/2, metrics on the admin socket, workers in group zccp, zccp.log (413's context id: its request id)"

# --- Removal, as written; the operator's edit where its comment says
REMOVAL=${BLOCKS[14]}
cut=$(grep -n '^# in your server {} block' "$REMOVAL" | cut -d: -f1)
[ -n "$cut" ] || fail "Removal no longer says where to edit the server block: update this script"
head -n $((cut - 1)) "$REMOVAL" > "$W/removal-a.sh"
tail -n +"$cut" "$REMOVAL" > "$W/removal-b.sh"
run_block 15 "$W/removal-a.sh"
without_zccp /etc/nginx/sites-enabled/example > "$W/site" && cat "$W/site" > /etc/nginx/sites-enabled/example
say "block 15: the include and the access_log lines out of the operator's server (the operator's edit)"
run_block 15 "$W/removal-b.sh"
# the comment on `rm /etc/sysusers.d/zccp.conf`: rmdir it if step 3 created it
[ "$SYSUSERS_D_BEFORE" = 1 ] || rmdir /etc/sysusers.d

# --- the host is back
nginx -T 2>/dev/null > "$W/after-nginx-T"
cmp -s "$W/before/nginx-T" "$W/after-nginx-T" \
    || fail "nginx -T differs from before step 7: $(diff "$W/before/nginx-T" "$W/after-nginx-T" | head -20)"
site_ok || fail "the operator's site does not answer after the removal's restart"
code=$(curl -s -o /dev/null -w '%{http_code}' --http2 --cacert /etc/ssl/certs/example.pem https://your.host/health)
[ "$code" = 404 ] || fail "/health after the removal: $code (the operator's root has none: 404)"
for f in passwd group shadow gshadow; do
    cmp -s "/etc/$f" "$W/before/$f" || fail "/etc/$f differs from before step 3: $(diff "$W/before/$f" "/etc/$f")"
done
id -nG www-data | grep -qw zccp && fail "www-data is still in group zccp"
ps -o supgrp= -C nginx | grep -q zccp && fail "an nginx process still has the group zccp"
left=$(ps -eo args | grep -E '[z]ccp' || true)
[ -z "$left" ] || fail "processes left: $left"
grep -q zccp /proc/net/unix && fail "sockets left: $(grep zccp /proc/net/unix)"
ls /dev/shm | grep -q zccp && fail "/dev/shm: $(ls /dev/shm)"
for p in /run/zccp /etc/nginx/zccp /etc/zccp /etc/nginx/conf.d/zccp.conf /etc/nginx/conf.d/zccp-admin.conf \
         /etc/systemd/system/zccp-engine.service /etc/sysusers.d /opt/zccp; do
    [ ! -e "$p" ] || fail "$p is left"
done
ls /var/log/nginx | grep -q zccp && fail "/var/log/nginx: $(ls /var/log/nginx)"
[ -z "$(redis-cli --scan --pattern 'zccp[:_]*')" ] || fail "Redis keys left: $(redis-cli --scan --pattern 'zccp[:_]*' | head)"
[ "$(redis-cli get operator:own)" = stays ] || fail "the operator's own Redis key is gone"
say "removed: nginx -T as before step 7 (byte for byte), nginx restarted and serves the site, /etc/passwd group shadow gshadow as before step 3"
say "left: no zccp process, socket, /dev/shm segment, file or Redis key; the operator's key stays; packages stay (as Removal says)"
say "PASSED"
