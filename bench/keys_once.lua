-- bench/keys_pieces.py --once: the key check, the admission and the settlement run once per
-- request, as on ZCCP's own path (so LuaJIT compiles, or does not, as it does there); each
-- one's ns summed in the metrics dict. ?report=1: the means per request (JSON), and reset.
local cjson = require "cjson.safe"
require "zccp.lib.libc"   -- declares struct zccp_timespec and clock_gettime (cpu_ns)
local auth = require "zccp.plugins.auth.keys"
local limits = require "zccp.plugins.limits.admit"

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
local d = ngx.shared.zccp_metrics
local usage_log = require "zccp.plugins.limits.usage_log"
local set_headers = require("zccp.plugins.limits.headers").set
local PARTS = { "auth.admit", "limits.admit", "rate-limit headers", "limits.settle",
                "usage_log.line (with the request id)", "nothing (the clock's own cost)" }

if ngx.var.arg_report then
    local n = d:get("bench:n") or 0
    local out = { requests = n }
    for _, p in ipairs(PARTS) do
        out[p] = n > 0 and (d:get("bench:" .. p) or 0) / n or 0
        d:delete("bench:" .. p)
    end
    d:delete("bench:n")
    ngx.header["Content-Type"] = "application/json"
    return ngx.print(cjson.encode(out))
end

ngx.req.read_body()
local body = ngx.req.get_body_data() or ""
-- The request id before any timing, passed to the admission as zccp.handler passes it:
-- its first read makes it (here nginx's $request_id, one RAND_bytes); read first inside
-- settle, making it would be charged to the limits.
local rid = ngx.var.zccp_request_id
-- which usage_log.line this tree has, asked before the timing (debug.getinfo is not compiled
-- and makes a table: inside the settle's interval it was charged to the settle)
local new_line = debug.getinfo(usage_log.line, "u").nparams == 7   -- this branch's (6: before it)
local t0 = cpu_ns()
local who = auth.admit("anthropic")
local t1 = cpu_ns()
if not who then
    return
end
local r = { who = who, api = "anthropic", body = body, request_id = rid }
local _, ticket = limits.admit(r)
local t2 = cpu_ns()
if ticket then   -- an admitted reservation: its headers, as plugins/ratelimit_headers sets them
    set_headers(ticket.api, ticket.w, ticket.at)
end
local t2h = cpu_ns()
limits.settle(r)
local t3 = cpu_ns()
local line
if new_line then
    line = usage_log.line({ who = who, api = "anthropic" }, rid, 200, 10, 20, 0, "HIT")
else
    line = usage_log.line({ who = who, api = "anthropic", request_id = rid }, 200, 10, 20, 0,
                          "HIT")
end
local t4 = cpu_ns()
local t5 = cpu_ns()   -- an empty interval: what every row above includes of the clock itself
d:incr("bench:usage_log.line (with the request id)", tonumber(t4 - t3), 0)
d:incr("bench:auth.admit", tonumber(t1 - t0), 0)
d:incr("bench:limits.admit", tonumber(t2 - t1), 0)
d:incr("bench:rate-limit headers", tonumber(t2h - t2), 0)
d:incr("bench:limits.settle", tonumber(t3 - t2h), 0)
d:incr("bench:nothing (the clock's own cost)", tonumber(t5 - t4), 0)
d:incr("bench:n", 1, 0)
ngx.print(#line > 0 and "ok" or "")
