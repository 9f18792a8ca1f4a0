-- bench/keys_pieces.py's location: each piece of the key check and the limits, N times in
-- one request, in ns per call (JSON). Query: ?plain=<key without limits>&limited=<key with
-- limits>&n=<iterations>. The body is the request's (1 KiB, as bench/keys.py sends).
local cjson = require "cjson.safe"
local libc = require "zccp.libc"
local tenant = require "zccp.tenant"
local auth = require "zccp.auth"
local limits = require "zccp.limits"
local metrics = require "zccp.metrics"
local usage_log = require "zccp.usage_log"

local ngx = ngx
local tonumber = tonumber

local args = ngx.req.get_uri_args()
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

local function time(name, f, n)
    n = n or N
    f()   -- warm (first use: caches, traces)
    local t0 = libc.now_ns()
    for _ = 1, n do
        f()
    end
    local dt = tonumber(libc.now_ns() - t0)
    out[name] = dt / n
    order[#order + 1] = name
end

local function as(key)
    ngx.req.set_header("x-api-key", key)
end

time("empty loop", function() end)
as(args.plain)
time("tenant.api_key", tenant.api_key)
time("ngx.var.zccp_request_id", function() return ngx.var.zccp_request_id end)
time("ngx.ctx write", function() ngx.ctx.zccp_bench = 1 end)
time("ngx.ctx read", function() return ngx.ctx.zccp_limits end)
time("metrics.count", function() metrics.count("zccp_nginx_auth_total", "anthropic", "ok") end)
time("auth.admit (key, no limits)", function() return auth.admit("anthropic") end)
local plain = auth.admit("anthropic")
time("auth.wants_body (no limits)", function() return auth.wants_body(plain) end)
time("limits.admit (no limits)", function() return limits.admit(plain, "anthropic", body) end)
time("limits.admit+settle (no limits)", function()
    limits.admit(plain, "anthropic", body)
    limits.settle()
end, 5000)
time("limits.settle alone (no limits)", function()
    limits.admit(plain, "anthropic", body)
    local t0 = libc.now_ns()
    limits.settle()
    return libc.now_ns() - t0
end, 5000)
time("ngx.status read", function() return ngx.status end)
time("settle steps: ctx get/nil", function()
    limits.admit(plain, "anthropic", body)
    local ctx = ngx.ctx
    local t = ctx.zccp_limits
    ctx.zccp_limits = nil
    return t
end, 5000)
time("settle steps: +acc", function()
    limits.admit(plain, "anthropic", body)
    local ctx = ngx.ctx
    local t = ctx.zccp_limits
    ctx.zccp_limits = nil
    local status = ngx.status
    local acc = t.w.acc
    acc.requests = acc.requests + 1
    acc.status[status] = (acc.status[status] or 0) + 1
    acc.input_tokens = acc.input_tokens + 0
    return usage_log.enabled()
end, 5000)
time("libc.now_ns x2", function() return libc.now_ns() - libc.now_ns() end)
ngx.sleep(0.2)   -- the flusher sends what was queued
as(args.limited)
local limited = auth.admit("anthropic")
time("auth.admit (key with limits)", function() return auth.admit("anthropic") end)
time("limits.admit (limits)", function() return limits.admit(limited, "anthropic", body) end)
ngx.sleep(0.2)
time("limits.admit+settle (limits)", function()
    limits.admit(limited, "anthropic", body)
    limits.settle()
end, 5000)
ngx.sleep(0.2)
ngx.header["X-ZCCP-Cache"] = "HIT"
time("ngx.var.sent_http_x_zccp_cache", function() return ngx.var.sent_http_x_zccp_cache end)
local t = { who = limited, api = "anthropic", request_id = "abc", day = "20260101" }
time("usage_log.line", function() return usage_log.line(t, "abc", 200, 10, 20, 0, "HIT") end)
time("cjson.decode (the body)", function() return cjson.decode(body) end, 2000)
time("ngx.header set x1 (override)", function() ngx.header["anthropic-ratelimit-requests-limit"] = 1000 end)
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
    time("raw FFI get_request", function() return base.get_request() end)
end
local set_resp_header = require("resty.core.response").set_resp_header
time("ngx.header set x1 (no override)", function()
    set_resp_header(nil, "anthropic-ratelimit-requests-remaining", "999", true)
end, 200)
time("tostring(number)", function() return tostring(N + 12345) end)

ngx.header["Content-Type"] = "application/json"
local on = jit.status()
local rows = { { name = "jit " .. (on and "on" or "off") .. " " .. jit.version, ns = 0 } }
for i, name in ipairs(order) do
    rows[i + 1] = { name = name, ns = out[name] }
end
ngx.print(cjson.encode(rows))
