-- wrk -s bench/cache_eval/post.lua URL -- BODY_FILE [CACHE_CONTROL]
-- POSTs the one JSON body in BODY_FILE on every request; CACHE_CONTROL (optional) is sent
-- as the Cache-Control header. done() prints "WRKJSON {...}" with exact counts and percentiles.

local req

function init(args)
    local f = assert(io.open(args[1], "rb"))
    local body = f:read("*a")
    f:close()
    local headers = { ["Content-Type"] = "application/json" }
    if args[2] and #args[2] > 0 then
        headers["Cache-Control"] = args[2]
    end
    req = wrk.format("POST", nil, headers, body)
end

function request()
    return req
end

function done(summary, latency, requests)
    local e = summary.errors
    io.write(string.format(
        'WRKJSON {"requests":%d,"duration_us":%d,"err_connect":%d,"err_read":%d,"err_write":%d,' ..
        '"err_status":%d,"err_timeout":%d,"lat_mean_us":%.1f,"lat_max_us":%d,' ..
        '"p50_us":%d,"p90_us":%d,"p99_us":%d,"p999_us":%d}\n',
        summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
        latency.mean, latency.max, latency:percentile(50), latency:percentile(90),
        latency:percentile(99), latency:percentile(99.9)))
end
