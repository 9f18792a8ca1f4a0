# Shared Docker plumbing for the scripts that test ZCCP in containers (scripts/debian12-check.sh;
# scripts/compose-smoke.sh can source it too). Source it; it defines functions only:
#   docker_up            install docker.io if missing, start dockerd if none answers
#                        (DOCKERD_PID is set when this shell started it; docker_down stops only that one)
#   docker_down          stop the dockerd docker_up started, if any
#   debian_base_image    make debian:bookworm-slim locally with debootstrap when absent (no registry here)
# Needs root (or sudo). LOG_DIR: where dockerd.log and debootstrap.log go (default: a temp dir).
# Facts behind these steps: /work/shared/docker-notes.md (measured on these machines).

_SUDO=""
[ "$(id -u)" -eq 0 ] || _SUDO="sudo"
: "${LOG_DIR:=$(mktemp -d)}"
DOCKERD_PID=""

_apt_install() {
    $_SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $_SUDO apt-get install -y -qq "$@" >/dev/null
}

docker_up() {
    command -v dockerd >/dev/null || _apt_install docker.io
    docker info >/dev/null 2>&1 && return 0
    $_SUDO dockerd --pidfile "$LOG_DIR/dockerd.pid" > "$LOG_DIR/dockerd.log" 2>&1 &
    local _
    for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
    if ! docker info >/dev/null 2>&1; then
        echo "dockerd did not come up: $(tail -5 "$LOG_DIR/dockerd.log")" >&2
        return 1
    fi
    # Another dockerd may have won the race for the socket: stop ours only if it is the one running.
    if [ -s "$LOG_DIR/dockerd.pid" ] && $_SUDO kill -0 "$(cat "$LOG_DIR/dockerd.pid")" 2>/dev/null; then
        DOCKERD_PID=$(cat "$LOG_DIR/dockerd.pid")
    fi
}

docker_down() {
    [ -n "$DOCKERD_PID" ] || return 0
    $_SUDO kill -TERM "$DOCKERD_PID" 2>/dev/null || true
    local _
    for _ in $(seq 1 60); do $_SUDO kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.5; done
    DOCKERD_PID=""
}

# The Debian mirror apt already uses on this machine (deb822 .sources first, then .list files).
_debian_mirror() {
    local m
    m=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -1)
    [ -n "$m" ] || m=$(awk '$1 == "deb" && $2 !~ /security/ {print $2; exit}' \
                       /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null)
    echo "$m"
}

debian_base_image() {
    docker image inspect debian:bookworm-slim >/dev/null 2>&1 && return 0
    command -v debootstrap >/dev/null || _apt_install debootstrap
    local mirror rootfs
    mirror=$(_debian_mirror)
    [ -n "$mirror" ] || { echo "no Debian mirror in /etc/apt/sources.list*" >&2; return 1; }
    rootfs=$(mktemp -d)
    if ! timeout 600 $_SUDO debootstrap --variant=minbase bookworm "$rootfs" "$mirror" > "$LOG_DIR/debootstrap.log" 2>&1; then
        echo "debootstrap failed: $(tail -5 "$LOG_DIR/debootstrap.log")" >&2
        $_SUDO rm -rf "$rootfs"
        return 1
    fi
    $_SUDO rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    $_SUDO tar -C "$rootfs" -c . | docker import -c 'CMD ["bash"]' - debian:bookworm-slim >/dev/null
    $_SUDO rm -rf "$rootfs"
}

# This machine's pip settings (a CA certificate, a local find-links folder) handed to a
# container: appends to the caller's MOUNTS and ENVS arrays (both scripts that run a clean
# clone in debian:bookworm-slim install from the same registries as this machine).
container_pip_settings() {
    local cert links
    _pip_setting() { python3 -m pip config get "global.$1" 2>/dev/null || true; }
    cert=${PIP_CERT:-$(_pip_setting cert)}
    if [ -n "$cert" ] && [ -f "$cert" ]; then
        MOUNTS+=(-v "$cert:/etc/zccp-check/ca.crt:ro"); ENVS+=(-e PIP_CERT=/etc/zccp-check/ca.crt)
    fi
    links=${PIP_FIND_LINKS:-$(_pip_setting find-links)}
    if [ -n "$links" ] && [ -d "$links" ]; then
        MOUNTS+=(-v "$links:/opt/zccp-wheels:ro"); ENVS+=(-e PIP_FIND_LINKS=/opt/zccp-wheels)
    fi
}
