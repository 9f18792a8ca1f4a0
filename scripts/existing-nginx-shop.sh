# The second operator site of scripts/existing-nginx-walkthrough.sh (sourced by
# existing-nginx-inside.sh, which defines say and fail): a realistic one, shop.example, the
# nginx's default_server. `listen 443 ssl http2 default_server`, port 80 redirected, a backend
# behind `location /` that also answers the load balancer's /health, `location /static/`
# with alias, a map and limit_req_zone in conf.d with client_max_body_size 1m and gzip at
# http level, server-level limit_req, add_header (HSTS) and error_page 502 503 504.
# ZCCP joins it through step 7's lines, as it joins the first site.
SHOP=https://shop.example
SHOP_CA=/etc/ssl/certs/shop.pem
SHOP_FILE=/etc/nginx/sites-enabled/shop

shop_install() {
    install -d -m 0710 /etc/ssl/private
    openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj /CN=shop.example \
        -addext subjectAltName=DNS:shop.example -keyout /etc/ssl/private/shop.key -out "$SHOP_CA" 2>/dev/null
    echo '127.0.0.1 shop.example' >> /etc/hosts
    install -d /var/www/shop/static /var/www/shop-errors
    # large enough for gzip (gzip_min_length), the same bytes every run
    for i in $(seq 1 40); do echo ".shop-rule-$i { margin: ${i}px; color: #$((100 + i)); }"; done > /var/www/shop/static/app.css
    echo '<html><body>the shop is resting</body></html>' > /var/www/shop-errors/50x.html
    cat > /etc/nginx/conf.d/shop.conf <<'NGINX'
# the shop's http-level settings (conf.d/ is included inside http {}; Debian's nginx.conf has gzip on)
client_max_body_size 1m;
gzip_types text/plain text/css application/json;
gzip_min_length 256;
map $http_user_agent $shop_client {
    default           browser;
    ~*^(curl|wget)/   tool;
}
limit_req_zone $binary_remote_addr zone=shop:1m rate=10r/s;
NGINX
    cat > "$SHOP_FILE" <<'NGINX'
# the shop's backend (the operator's application), on loopback
server {
    listen 127.0.0.1:8081;
    default_type text/plain;
    location = /health { return 200 "app ok\n"; }
    location / { return 200 "shop backend: $request_uri ($http_x_shop_client)\n"; }
}

server {
    listen 80 default_server;
    server_name _;
    return 301 https://$host$request_uri;
}

server {
    listen 443 ssl http2 default_server;
    server_name shop.example;
    ssl_certificate     /etc/ssl/certs/shop.pem;
    ssl_certificate_key /etc/ssl/private/shop.key;

    limit_req zone=shop burst=20 nodelay;
    limit_req_status 429;
    add_header Strict-Transport-Security "max-age=31536000" always;
    error_page 502 503 504 /50x.html;
    location = /50x.html { root /var/www/shop-errors; internal; }

    location /static/ {
        alias /var/www/shop/static/;
    }
    location / {
        proxy_pass http://127.0.0.1:8081;
        proxy_set_header X-Shop-Client $shop_client;
    }
}
NGINX
}

# The shop's own paths, each as status, headers that matter and body bytes, into DIR.
shop_capture() {
    local dir=$1 name url extra
    mkdir -p "$dir"
    while read -r name url extra; do
        # shellcheck disable=SC2086
        curl -s --http2 --cacert "$SHOP_CA" $extra -o "$dir/$name.body" \
            -w '%{http_code} %{content_type} %header{location} %header{content-encoding} %header{strict-transport-security}\n' \
            "$url" > "$dir/$name.head" || fail "shop: $url did not answer"
    done <<EOF
root $SHOP/
health $SHOP/health
page $SHOP/orders/42?x=1
static $SHOP/static/app.css
static-gzip $SHOP/static/app.css -H Accept-Encoding:gzip
missing-static $SHOP/static/nothing.css
redirect http://shop.example/health
EOF
}

shop_compare() {   # DIR_BEFORE WHEN [NAME...]: the shop's paths (or NAMEs) answer byte for byte as in DIR_BEFORE
    local before=$1 when=$2 now name diffs=""
    shift 2
    local names=("$@")
    [ "${#names[@]}" -gt 0 ] || mapfile -t names < <(cd "$before" && ls -- *.head | sed 's/\.head$//')
    now=$(mktemp -d)
    shop_capture "$now"
    for name in "${names[@]}"; do
        cmp -s "$before/$name.head" "$now/$name.head" && cmp -s "$before/$name.body" "$now/$name.body" \
            || diffs+=" $name: $(cat "$now/$name.head") $(head -c 120 "$now/$name.body" | tr '\n' ' ');"
    done
    rm -rf "$now"
    [ -z "$diffs" ] || { echo "shop.example $when differs from before step 1:$diffs"; return 1; }
}

# ZCCP's paths under the shop's server-level limit_req: some requests refused (the site's
# limit applies to them too), and every answer that is not a 2xx is JSON, never nginx's HTML.
shop_flood() {   # prints "N_ANSWERS N_429 N_HTML_ERRORS" for 60 requests sent back to back
    local args=() i api body
    for i in $(seq 1 30); do
        for api in messages chat/completions; do
            body='{"model":"zccp-tiny","max_tokens":8,"temperature":0,"messages":[{"role":"user","content":"limit me"}]}'
            args+=(--next -s --http2 --cacert "$SHOP_CA" -o /dev/null -w '%{http_code} %{content_type}\n'
                   -H 'content-type: application/json' -d "$body" "$SHOP/v1/$api")
        done
    done
    curl "${args[@]:1}" | awk '{ n++ } $1 == 429 { r++ } $1 !~ /^2/ && $2 !~ /json/ { h++ }
                                END { printf "%d %d %d\n", n, r, h }'
}
