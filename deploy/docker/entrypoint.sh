#!/bin/sh
# Container entrypoint: `engine`, `nginx`, `front`, `redis`, or any other command.
set -eu
umask 0027   # nothing this container writes is world-readable (arena + socket set their own)
CONFIG=${ZCCP_CONFIG:-/etc/zccp/config.yaml}
NGINX_DIR=/run/zccp-nginx   # rendered conf, pid, logs, temp files (writable by nginx's user)

case "${1:-}" in
engine)
    shift
    exec zccp-engine --config "$CONFIG" "$@"
    ;;
nginx)
    shift
    # /etc/nginx/nginx.conf links to $NGINX_DIR/nginx.conf, so a plain
    # `nginx -s reload` finds this config and the pid file the master wrote.
    zccp-nginx --config "$CONFIG" --out "$NGINX_DIR" --standalone --prefix "$NGINX_DIR" >/dev/null
    ln -sf /dev/stderr "$NGINX_DIR/logs/error.log"
    ln -sf /dev/stdout "$NGINX_DIR/logs/access.log"
    nginx -t -q
    exec nginx -g 'daemon off;' "$@"
    ;;
front)
    shift
    # The front tier (docs/scale-out.md): nginx only, routing to the hosts front.yaml names.
    zccp-nginx render --front "${ZCCP_FRONT_CONFIG:-/etc/zccp/front.yaml}" --out "$NGINX_DIR" >/dev/null
    ln -sf /dev/stderr "$NGINX_DIR/logs/front-error.log"
    ln -sf /dev/stdout "$NGINX_DIR/logs/front-access.log"
    exec nginx -e stderr -p "$NGINX_DIR" -c "$NGINX_DIR/nginx.conf" -g 'daemon off;' "$@"
    ;;
redis)
    shift
    # A cache: no persistence, bounded memory. Reached only on the compose network.
    exec redis-server --bind 0.0.0.0 --port 6379 --protected-mode no --save "" \
        --appendonly no --dir /var/lib/redis --maxmemory "${REDIS_MAXMEMORY:-256mb}" \
        --maxmemory-policy allkeys-lru "$@"
    ;;
*)
    exec "$@"
    ;;
esac
