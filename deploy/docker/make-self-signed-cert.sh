#!/bin/sh
# A self-signed certificate for trying server.tls with docker compose (deploy/README.md
# "TLS and HTTP/2"): deploy/docker/tls/{cert,key}.pem, EC P-256, for localhost and
# 127.0.0.1, valid 30 days. The key is 0640 to gid 10000 (the image's group zccp), so the
# nginx container's user can read it. For real traffic, put your own certificate there.
set -eu
dir=$(dirname "$0")/tls
mkdir -p "$dir"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
    -subj /CN=localhost -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
    -keyout "$dir/key.pem" -out "$dir/cert.pem" 2>/dev/null
chmod 0644 "$dir/cert.pem"
chmod 0640 "$dir/key.pem"
chgrp 10000 "$dir/key.pem" 2>/dev/null || echo "note: run as root (or chgrp 10000 $dir/key.pem yourself) so the container can read the key" >&2
echo "$dir/cert.pem $dir/key.pem"
