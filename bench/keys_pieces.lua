-- bench/keys_pieces.py's location: each piece of the key check and the limits, N times in
-- one request, in ns per call (JSON). Query: ?plain=<key without limits>&limited=<key with
-- limits>&n=<iterations>. The body is the request's (1 KiB, as bench/keys.py sends).
local cjson = require "cjson.safe"
require "zccp.lib.libc"   -- declares struct zccp_timespec and clock_gettime (cpu_ns)
local tenant = require "zccp.lib.tenant"
local auth = require "zccp.plugins.auth.keys"
local limits = require "zccp.plugins.limits.admit"
local metrics = require "zccp.lib.metrics"
local usage_log = require "zccp.plugins.limits.usage_log"

local ngx = ngx
local tonumber = tonumber
-- The worker thread's CPU time in ns (CLOCK_THREAD_CPUTIME_ID): on a shared machine, time
-- the worker spent preempted is not charged to the piece (the wall clock charged it).
local ffi = require "ffi"
local cpu_ts = ffi.new("struct zccp_timespec")
local function cpu_ns()
    ffi.C.clock_gettime(3, cpu_ts)
    return ffi.cast("uint64_t", cpu_ts.tv_sec) * 1000000000ULL + tonumber(cpu_ts.tv_nsec)
end

local args = ngx.req.get_uri_args()
if args.nojit then   -- the interpreter only: how most of a real request's Lua runs (bench/keys.md)
    jit.off()
    jit.flush()
end
if args.jitv then   -- LuaJIT's trace log (aborts, NYI) into this file
    package.path = package.path .. ";/usr/share/luajit-2.1.0-beta3/?.lua"
    require("jit.v").start(args.jitv)
end
if args.probe then
    return ngx.print("ready")
end
local N = tonumber(args.n) or 20000
ngx.req.read_body()
local body = ngx.req.get_body_data() or ""

local out = {}
local order = {}

-- The least of REPEAT runs of n calls (the machine is shared: the least is the least disturbed).
local REPEAT = tonumber(args.repeats) or 7

local kept   -- each call's result is kept here: LuaJIT would not build a value nobody uses

local function time(name, f, n)
    n = n or N
    f()   -- warm (first use: caches, traces)
    local best
    for _ = 1, REPEAT do
        local t0 = cpu_ns()
        for _ = 1, n do
            kept = f()
        end
        local per = tonumber(cpu_ns() - t0) / n
        best = best and math.min(best, per) or per
        ngx.sleep(0.06)   -- the flush timers run between runs (zccp.plugins.limits.admit, zccp.lib.metrics)
    end
    if not out[name] then
        order[#order + 1] = name
    end
    out[name] = best
end

local function as(key)
    ngx.req.set_header("x-api-key", key)
end

time("empty loop", function() end)
as(args.plain)
time("tenant.api_key", tenant.api_key)
time("ngx.var.zccp_request_id", function() return ngx.var.zccp_request_id end)
time("ngx.ctx write", function() ngx.ctx.zccp_bench = 1 end)
time("ngx.ctx read", function() return ngx.ctx.zccp end)
time("metrics.count", function() metrics.count("zccp_nginx_auth_total", "anthropic", "ok") end)
time("auth.admit (key, no limits)", function() return auth.admit("anthropic") end)
local plain = auth.admit("anthropic")
time("auth.wants_body (no limits)", function() return auth.wants_body(plain) end)
time("limits.admit+settle (no limits)", function()
    local r = { who = plain, api = "anthropic", body = body }
    limits.admit(r)
    limits.settle(r)
end, 5000)
ngx.sleep(0.2)   -- the flusher sends what was queued
as(args.limited)
local limited = auth.admit("anthropic")
time("auth.admit (key with limits)", function() return auth.admit("anthropic") end)
ngx.sleep(0.2)
time("limits.admit+settle (limits)", function()
    local r = { who = limited, api = "anthropic", body = body }
    limits.admit(r)
    limits.settle(r)
end, 5000)
ngx.sleep(0.2)
time("limits.admit+settle (limits), OpenAI: 6 headers", function()
    local r = { who = limited, api = "openai", body = body }
    limits.admit(r)
    limits.settle(r)
end, 5000)
ngx.sleep(0.2)
ngx.header["X-ZCCP-Cache"] = "HIT"
time("ngx.var.sent_http_x_zccp_cache", function() return ngx.var.sent_http_x_zccp_cache end)
local t = { who = limited, api = "anthropic", request_id = "abc", day = "20260101" }
local n_params = debug.getinfo(usage_log.line, "u").nparams   -- 6: the line before issue 18's speed-up
time("usage_log.line", function()
    if n_params == 6 then
        return usage_log.line(t, 200, 10, 20, ngx.now() % 7, "HIT")
    end
    return usage_log.line(t, "abc", 200, 10, 20, ngx.now() % 7, "HIT")
end)
time("cjson.decode (the body)", function() return cjson.decode(body) end, 2000)
time("ngx.header set x1 (override)", function() ngx.header["anthropic-ratelimit-requests-limit"] = 1000 end)
local NAMES = {}
for _, what in ipairs({ "requests", "input-tokens", "output-tokens", "tokens" }) do
    for _, f in ipairs({ "limit", "remaining", "reset" }) do
        NAMES[#NAMES + 1] = "anthropic-ratelimit-" .. what .. "-" .. f
    end
end
time("ngx.header set x12 (Anthropic's rate-limit headers)", function()
    for i = 1, 12 do
        ngx.header[NAMES[i]] = i
    end
end, 2000)
local ok_rh, resp_header = pcall(require, "zccp.plugins.limits.resp_header")
if ok_rh then
    time("resp_header.put x12 (the same headers)", function()
        local r = resp_header.request()
        for i = 1, 12 do
            resp_header.put(r, NAMES[i], "1234")
        end
    end, 2000)
end
do
    local ffi = require "ffi"
    local base = require "resty.core.base"
    local C = ffi.C
    local errmsg = base.get_errmsg_ptr()
    local r = base.get_request()
    local k, v = "anthropic-ratelimit-tokens-limit", "123456"
    time("raw FFI set_resp_header x1", function()
        return C.ngx_http_lua_ffi_set_resp_header(r, k, #k, false, v, #v, nil, 0, 1, errmsg)
    end)
end

if args.jitv then
    require("jit.v").off()   -- closes its file
end
if args.nojit then
    jit.on()
end
ngx.header["Content-Type"] = "application/json"
local on = jit.status()
local rows = { { name = "jit " .. (on and "on" or "off") .. " " .. jit.version, ns = 0 } }
for i, name in ipairs(order) do
    rows[i + 1] = { name = name, ns = out[name] }
end
rows[#rows + 1] = { name = "(kept: " .. type(kept) .. ")", ns = 0 }
ngx.print(cjson.encode(rows))
