-- wrk -s bench/wrk/post.lua URL -- BODIES_FILE [no-cache|-] [API_KEY]
-- POSTs application/json bodies. BODIES_FILE holds one JSON body per line; each
-- wrk thread cycles through them (one line = the same body every time).
-- "no-cache" adds Cache-Control: no-cache, no-store (ZCCP's cache-bypass run); API_KEY is
-- sent as x-api-key (bench/keys.py).
-- done() prints one line "WRKJSON {...}" with exact counts and percentiles, and
-- "statuses": every non-2xx answer by HTTP status (wrk itself only counts them).

local reqs = {}
local n, i = 0, 0
local threads = {}     -- main state: each thread, to collect its counts in done()
statuses = {}          -- per thread (global, so that thread:get() can read it): status -> count

function setup(thread)
    threads[#threads + 1] = thread
end

function init(args)
    local path = args[1]
    local headers = { ["Content-Type"] = "application/json" }
    if args[2] == "no-cache" then
        headers["Cache-Control"] = "no-cache, no-store"
    end
    if args[3] then
        headers["x-api-key"] = args[3]
    end
    local f = assert(io.open(path, "rb"))
    for line in f:lines() do
        if #line > 0 then
            n = n + 1
            reqs[n] = wrk.format("POST", nil, headers, line)
        end
    end
    f:close()
    assert(n > 0, "no bodies in " .. path)
    i = math.random(n) - 1
end

function request()
    i = i % n + 1
    return reqs[i]
end

function response(status)
    if status < 200 or status > 299 then
        statuses[status] = (statuses[status] or 0) + 1
    end
end

function done(summary, latency, requests)
    local e = summary.errors
    local total = {}
    for _, t in ipairs(threads) do
        for status, count in pairs(t:get("statuses") or {}) do
            total[status] = (total[status] or 0) + count
        end
    end
    local parts = {}
    for status, count in pairs(total) do
        parts[#parts + 1] = string.format('"%d":%d', status, count)
    end
    io.write(string.format(
        'WRKJSON {"requests":%d,"duration_us":%d,"bytes":%d,"err_connect":%d,"err_read":%d,' ..
        '"err_write":%d,"err_status":%d,"err_timeout":%d,"lat_mean_us":%.1f,"lat_max_us":%d,' ..
        '"p50_us":%d,"p90_us":%d,"p99_us":%d,"p999_us":%d,"statuses":{%s}}\n',
        summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
        e.timeout, latency.mean, latency.max, latency:percentile(50), latency:percentile(90),
        latency:percentile(99), latency:percentile(99.9), table.concat(parts, ",")))
end
