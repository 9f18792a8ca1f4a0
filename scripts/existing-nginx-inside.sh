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
# shellcheck source=existing-nginx-shop.sh
. scripts/existing-nginx-shop.sh
extract_blocks "$DOC" "$W/blocks"
check_plan "$W/blocks"
BLOCKS=("$W/blocks"/*)

# What any Debian 12 host has before step 1 and minbase lacks: systemd's tools (not its
# init), passwd, procps, curl, openssl, CA certificates; and this operator's nginx.
apt-get update -qq
apt-get install -y -qq systemd passwd procps curl openssl ca-certificates nginx >/dev/null
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
# invoke-rc.d, through which packages start, stop and reload services, blocks every action
# where there is no /sbin/init and no runlevel: with these two, it acts through the init
# scripts as on a host (a package's trigger reloads nginx), unless a policy-rc.d says no.
printf '#!/bin/sh\necho "N 2"\n' > /sbin/runlevel
printf '#!/bin/sh\necho "init (stand-in for invoke-rc.d): not run" >&2\nexit 1\n' > /sbin/init
chmod 0755 /sbin/runlevel /sbin/init

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

expect_line() {   # NUMBER LINE: the block's output has LINE as a line of its own
    grep -qx -- "$2" "$W/out/$1.txt" || fail "block $1's output has no line '$2'"
}
must() {   # NAME COMMAND...: a check with a name, said when it passes
    local name=$1; shift
    "$@" || fail "$name"
    say "passed: $name"
}
quiet_expect() { grep -qF -- "$2" "$W/out/$1.txt"; }
nginx_procs() { echo "$(cat /run/nginx.pid):$(ps -o pid= --ppid "$(cat /run/nginx.pid)" | sort -n | tr -d ' ' | tr '\n' ,)"; }
snapshot() {   # DIR: what Removal must give back
    mkdir -p "$1"
    dpkg -l > "$1/dpkg-l"
    nginx -T 2>/dev/null > "$1/nginx-T"
    ls /etc/nginx/modules-enabled > "$1/modules-enabled"
    for f in passwd group shadow gshadow; do cp "/etc/$f" "$1/$f"; done
}
same_as() {   # DIR WHAT FILE...: FILE(s) of the host now as in DIR's snapshot
    local dir=$1 what=$2 f now; shift 2
    now=$(mktemp -d); snapshot "$now"
    for f in "$@"; do
        cmp -s "$dir/$f" "$now/$f" || fail "$f differs from $what: $(diff "$dir/$f" "$now/$f" | head -20)"
    done
    rm -rf "$now"
}

# --- the operator's host before step 1: Debian's nginx with two sites of theirs, TLS only.
# The first is step 7's server block of the page (`your.host`); the second, shop.example,
# is a realistic one (scripts/existing-nginx-shop.sh) and the default server.
SITE_BLOCK=${BLOCKS[12]}
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
# shop.example is the default server on 443: the page's `default_server` comes off this one
operator_root "$SITE_BLOCK" | sed 's/^\( *listen 443 ssl http2\) default_server;/\1;/' > "$W/site-with-zccp"
grep -q default_server "$W/site-with-zccp" && fail "step 7's block changed its listen line: update this script"
without_zccp "$W/site-with-zccp" > /etc/nginx/sites-enabled/example
grep -q 'zccp' /etc/nginx/sites-enabled/example && fail "the operator's site still names zccp: $(cat /etc/nginx/sites-enabled/example)"
rm /etc/nginx/sites-enabled/default        # the shop's port-80 redirect is the default server
shop_install
nginx -t 2>/dev/null || fail "the operator's sites: $(nginx -t 2>&1)"
systemctl start nginx && systemctl reload nginx
site_ok() { curl -sf --http2 --cacert /etc/ssl/certs/example.pem https://your.host/ | grep -qx "the operator's own site"; }
shop_ok() { [ "$(curl -s --cacert "$SHOP_CA" "$SHOP/health")" = "app ok" ]; }
for _ in $(seq 1 50); do site_ok && shop_ok && break; sleep 0.2; done
site_ok || fail "the operator's site does not answer over https"
shop_ok || fail "shop.example's /health does not answer 'app ok'"
shop_capture "$W/before/shop"
snapshot "$W/before1"
say "the operator's sites answer over HTTP/2: https://your.host/ and https://shop.example/ (/health: $(cat "$W/before/shop/health.body"))"

# --- step 1: the page's apt line simulated first, then run; nginx is not reloaded
apt_line=$(sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "${BLOCKS[1]}" | grep -o 'apt-get install -y .*')
bash -c "${apt_line/install -y/install -s}" > "$W/apt-s.txt" || fail "apt-get install -s: $(tail -3 "$W/apt-s.txt")"
mods=$(awk '$1 == "Inst" && $2 ~ /^(libnginx-mod-|nginx)/ { print $2 }' "$W/apt-s.txt" | sort | tr '\n' ' ')
[ "$mods" = "libnginx-mod-http-lua libnginx-mod-http-ndk " ] || fail "apt-get install -s of step 1's line installs nginx packages: $mods"
procs=$(nginx_procs)
run_block 2
[ "$(nginx_procs)" = "$procs" ] || fail "step 1 reloaded nginx: master:workers $procs, now $(nginx_procs)"
added=$(ls /etc/nginx/modules-enabled | comm -13 "$W/before1/modules-enabled" - | tr '\n' ' ')
[ "$added" = "10-mod-http-ndk.conf 50-mod-http-lua.conf " ] || fail "step 1 added to modules-enabled: $added"
grep -qx libnginx-mod-http-lua /etc/zccp/packages-added.txt || fail "packages-added.txt: $(cat /etc/zccp/packages-added.txt)"
say "step 1: apt-get install -s names no nginx module but the Lua module and NDK; $(wc -l < /etc/zccp/packages-added.txt) packages added; nginx not reloaded (master:workers $procs)"

# --- step 2: torch from the index where it answers, else from a copied wheel
sed 's|<this repository>|/src|' "${BLOCKS[2]}" > "$W/block3.sh"
run_block 3 "$W/block3.sh"
if [ -n "${WALK_NO_TORCH_INDEX:-}" ] && [ -d "${PIP_FIND_LINKS:-}" ]; then
    say "download.pytorch.org cannot be reached: the page's copied-wheel block, /root/wheels holding this machine's wheels"
    cp -r "$PIP_FIND_LINKS" /root/wheels
    (unset PIP_FIND_LINKS; run_block 5) || exit 1
    rm -rf /root/wheels
else
    run_block 4
fi
run_block 6
[ -f /opt/zccp/.venv/share/zccp/lua-vendor/nginx/redis.lua ] || fail "vendor-lua left no nginx/redis.lua"

# --- steps 3-6
[ -e /etc/sysusers.d ] && SYSUSERS_D_BEFORE=1 || SYSUSERS_D_BEFORE=0
snapshot "$W/before3"
run_block 7
expect 7 "zccp:x:"
run_block 8
run_block 9
expect 9 "/run/zccp/doorbell.sock"
redis-cli set operator:own stays >/dev/null          # the operator's own key in the Redis that stays
run_block 10
grep -q warning "$W/out/10.txt" && fail "render warned: $(grep warning "$W/out/10.txt")"
[ "$(stat -c '%U:%G %a' /var/log/nginx/zccp.log)" = "www-data:adm 640" ] \
    || fail "zccp.log is $(stat -c '%U:%G %a' /var/log/nginx/zccp.log), not www-data:adm 640"
snapshot "$W/before7"

# --- steps 7-8: the include in both operator servers
run_block 11
run_block 12
cp "$W/site-with-zccp" /etc/nginx/sites-enabled/example
span=$(awk "$ZCCP_SPAN" "$W/site-with-zccp")
{ sed '$d' "$SHOP_FILE"; echo; echo "$span"; echo "}"; } > "$W/shop-with-zccp"
cp "$W/shop-with-zccp" "$SHOP_FILE"
say "block 13 (step 7): the include and the two access_log lines, in sites-enabled/example and in shop's 443 server"
run_block 14
# A reload is asynchronous: the old workers answer until the new ones run. An operator types
# the next command seconds later; the script waits for the new workers' answer instead.
for _ in $(seq 1 150); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' --cacert /etc/ssl/certs/example.pem https://your.host/v1/models)" = 404 ] || break
    sleep 0.2
done

# --- Verify over HTTPS + HTTP/2 (--cacert), and both
run_block 16
must "/zccp/health answers ZCCP's health (Verify)" quiet_expect 16 '"status":"ok"'
expect 16 '"type":"message"'
expect_line 16 'HIT'
expect 16 '"chat.completion"'
run_block 17
expect 17 "zccp_engine_up 1"
expect 17 '"masks"'
ps -o supgrp= -C nginx | grep -q zccp || fail "no nginx process has the group zccp"
# nginx's own 413, a body never read: the request id stands in for the context id
head -c 700000 /dev/zero | tr '\0' ' ' > "$W/big.json"
code=$(curl -s -o /dev/null -w '%{http_code}' --http2 --cacert /etc/ssl/certs/example.pem -H 'x-request-id: walk-413' \
       -H 'content-type: application/json' --data-binary @"$W/big.json" https://your.host/v1/messages)
[ "$code" = 413 ] || fail "a 700 KB body: $code, not 413"
grep -q '"request_id":"walk-413","context_id":"walk-413"' /var/log/nginx/zccp.log \
    || fail "zccp.log has no 413 line with the request id as context id: $(tail -3 /var/log/nginx/zccp.log)"
[ -n "$(redis-cli --scan --pattern 'zccp:*')" ] || fail "no zccp:* key in Redis after Verify's temperature-0 answers"
say "Redis holds $(redis-cli --scan --pattern 'zccp:*' | wc -l) zccp:* key(s) before Removal"
grep -q '"status":200.*"cache"' /var/log/nginx/zccp.log || fail "zccp.log has no answer: $(cat /var/log/nginx/zccp.log)"
say "verified: health, both APIs over HTTP/2 (a HIT at temperature 0), the admin /health and metrics, workers in group zccp, zccp.log"

# --- the shop with ZCCP in its server
out=$(shop_compare "$W/before/shop" "with ZCCP included" root page static static-gzip missing-static redirect) || fail "$out"
must "shop.example's own /health still answers its backend's 'app ok' with ZCCP included" \
    shop_compare "$W/before/shop" "with ZCCP included" health
hsts=$(curl -s -o /dev/null -w '%{http_code} %header{strict-transport-security}' --http2 --cacert "$SHOP_CA" \
       -H 'content-type: application/json' -d '{"model":"zccp-tiny","max_tokens":8,"temperature":0,"messages":[{"role":"user","content":"hsts"}]}' \
       "$SHOP/v1/messages")
[ "$hsts" = "200 max-age=31536000" ] || fail "ZCCP's answer on shop.example: '$hsts', not 200 with the server's HSTS header"
sleep 3   # the shop's limit_req bucket refills
read -r n_answers n_429 n_html < <(shop_flood)
[ "$n_answers" = 60 ] || fail "the flood on shop.example: $n_answers answers of 60"
[ "$n_429" -gt 0 ] || fail "the shop's server-level limit_req refused none of 60 back-to-back requests on ZCCP's paths"
must "no HTML error on ZCCP's paths under shop's limit_req ($n_429 of 60 refused, $n_html of them not JSON)" test "$n_html" = 0
say "shop.example with ZCCP: its own paths as before step 1, HSTS on ZCCP's answers, $n_429 of 60 refused by its limit_req"

# --- Removal, as written; the operator's edit where its comment says
REMOVAL=${BLOCKS[17]}
cut=$(grep -n '^# in your server {} block' "$REMOVAL" | cut -d: -f1)
[ -n "$cut" ] || fail "Removal no longer says where to edit the server block: update this script"
head -n $((cut - 1)) "$REMOVAL" > "$W/removal-a.sh"
tail -n +"$cut" "$REMOVAL" > "$W/removal-b.sh"
run_block 18 "$W/removal-a.sh"
for f in /etc/nginx/sites-enabled/example "$SHOP_FILE"; do
    without_zccp "$f" > "$W/site" && cat "$W/site" > "$f"
done
say "block 18: the include and the access_log lines out of both operator servers (the operator's edit)"
run_block 18 "$W/removal-b.sh"
# the comment on `rm /etc/sysusers.d/zccp.conf`: rmdir it if step 3 created it
[ "$SYSUSERS_D_BEFORE" = 1 ] || rmdir /etc/sysusers.d

# --- ZCCP is gone: nginx -T as before step 7, users as before step 3
same_as "$W/before7" "before step 7" nginx-T
same_as "$W/before3" "before step 3" passwd group shadow gshadow
site_ok || fail "the operator's site does not answer after the removal's restart"
out=$(shop_compare "$W/before/shop" "after Removal") || fail "$out"
code=$(curl -s -o /dev/null -w '%{http_code}' --http2 --cacert /etc/ssl/certs/example.pem https://your.host/v1/models)
[ "$code" = 404 ] || fail "/v1/models after the removal: $code (the operator's root has none: 404)"
id -nG www-data | grep -qw zccp && fail "www-data is still in group zccp"
ps -o supgrp= -C nginx | grep -q zccp && fail "an nginx process still has the group zccp"
left=$(ps -eo args | grep -E '[z]ccp' || true)
[ -z "$left" ] || fail "processes left: $left"
grep -q zccp /proc/net/unix && fail "sockets left: $(grep zccp /proc/net/unix)"
ls /dev/shm | grep -q zccp && fail "/dev/shm: $(ls /dev/shm)"
for p in /run/zccp /etc/nginx/zccp /etc/zccp/config.yaml /etc/nginx/conf.d/zccp.conf /etc/nginx/conf.d/zccp-admin.conf \
         /etc/systemd/system/zccp-engine.service /etc/sysusers.d /opt/zccp; do
    [ ! -e "$p" ] || fail "$p is left"
done
[ "$(ls /etc/zccp)" = "$(printf 'packages-added.txt\npackages-before.txt')" ] || fail "/etc/zccp holds: $(ls /etc/zccp)"
ls /var/log/nginx | grep -q zccp && fail "/var/log/nginx: $(ls /var/log/nginx)"
[ -z "$(redis-cli --scan --pattern 'zccp[:_]*')" ] || fail "Redis keys left: $(redis-cli --scan --pattern 'zccp[:_]*' | head)"
[ "$(redis-cli get operator:own)" = stays ] || fail "the operator's own Redis key is gone"
say "ZCCP removed: nginx -T as before step 7, users as before step 3, both sites as before, no zccp process, socket, segment, file or Redis key; the operator's key stays"

# --- the packages: the host as before step 1
run_block 19
expect 19 "Purg libnginx-mod-http-lua"
grep '^Purg ' "$W/out/19.txt" | awk '{ print $2 }' | sort > "$W/purged"
same_as "$W/before1" "before step 1" dpkg-l nginx-T modules-enabled passwd group shadow gshadow
[ ! -e /etc/zccp ] || fail "/etc/zccp is left"
for _ in $(seq 1 50); do site_ok && shop_ok && break; sleep 0.2; done
out=$(shop_compare "$W/before/shop" "after the purge") || fail "$out"
say "packages purged ($(wc -l < "$W/purged")): dpkg -l, nginx -T, modules-enabled, passwd group shadow gshadow as before step 1; both sites answer"
say "PASSED"
