-- bench/jit_paths.py --phases: nginx CPU per phase of a real request. install() runs in
-- init_by_lua before zccp.init requires the request path, so the callers' cached locals
-- (local run = pipeline.run) capture these timed wrappers. The clock is the worker's
-- thread CPU time: a wrapped piece that yields would count other requests' work, so only
-- the pieces that do not yield on a 1 KiB request without Redis are wrapped (body.read and
-- ring are marked "may yield"); the rest of the request is the /proc total minus these.
local ffi = require "ffi"
require "zccp.lib.libc"   -- declares clock_gettime and struct zccp_timespec

local C = ffi.C
local ts = ffi.new("struct zccp_timespec")
local CLOCK_THREAD_CPUTIME_ID = 3
local tonumber = tonumber

local _M = {}

local function now_ns()
    C.clock_gettime(CLOCK_THREAD_CPUTIME_ID, ts)
    return tonumber(ts.tv_sec) * 1e9 + tonumber(ts.tv_nsec)
end

local function add(name, ns)
    local d = ngx.shared.zccp_bench_phases
    d:incr(name, ns, 0)
    d:incr(name .. "#", 1, 0)
end

local function wrap(mod, fn_name, label)
    local f = mod[fn_name]
    mod[fn_name] = function(a1, a2, a3, a4, a5, a6)
        local t0 = now_ns()
        local r1, r2, r3, r4 = f(a1, a2, a3, a4, a5, a6)
        add(label, now_ns() - t0)
        return r1, r2, r3, r4
    end
end

function _M.install()
    local pipeline = require "zccp.core.pipeline"
    local run, any, log = pipeline.run, pipeline.any, pipeline.log
    pipeline.run = function(phase, r, a1, a2, a3)
        local t0 = now_ns()
        local res = run(phase, r, a1, a2, a3)
        add("phase " .. phase, now_ns() - t0)
        return res
    end
    pipeline.any = function(phase, r)
        local t0 = now_ns()
        local res = any(phase, r)
        add("phase " .. phase, now_ns() - t0)
        return res
    end
    pipeline.log = function(api)
        local t0 = now_ns()
        log(api)
        add("phase log", now_ns() - t0)
    end
    local transport = require "zccp.core.transport"
    wrap(transport, "claim_and_fill", "core claim_and_fill")
    wrap(transport, "ring", "core ring (may yield)")
    wrap(transport, "hang_up", "core hang_up")
    wrap(transport, "release", "core release")
    wrap(require("zccp.core.body"), "read", "core body.read (may yield)")
    wrap(require("zccp.plugins.router.route"), "order", "core router.order")
    wrap(require("zccp.lib.arena"), "acquire", "core arena.acquire")
    -- inside the phases (counted in them too)
    local l1 = require "zccp.plugins.l1.cache"
    wrap(l1, "begin", "  in prepare: l1.begin")
    wrap(l1, "serve", "  in prepare/keys: l1.serve")
    wrap(l1, "keep", "  in relayed: l1.keep")
    local fingerprint = require "zccp.fp.fingerprint"
    wrap(fingerprint, "keys", "  in prepare: fingerprint.keys")
    wrap(fingerprint, "complete", "  in keys: fingerprint.complete")
    wrap(require("zccp.lib.tenant"), "digest", "  in prepare: tenant.digest")
    wrap(require("zccp.lib.metrics"), "log", "  in log: metrics.log")
    wrap(require("zccp.lib.metrics"), "l1", "  in prepare: metrics.l1")
end

-- bench/jit_paths.py --vmstate: LuaJIT's own sampling profiler (jit.profile, the one
-- behind luajit -jp) in every worker, 1 ms of the worker's CPU time per sample. Each
-- sample is counted by the VM's state when it was taken (N compiled trace, I interpreter,
-- C a C function or nginx itself, G garbage collector, J the trace compiler) and, for the
-- interpreter's and the collector's, by the Lua line it was at: which request-path lines do
-- not run compiled, and where a GC step ran (inside an allocation: where requests allocate).
function _M.profile()
    local profile = require "jit.profile"
    local dumpstack = profile.dumpstack
    local d = ngx.shared.zccp_bench_phases
    profile.start("li1", function(thread, samples, vmstate)
        d:incr("vm " .. vmstate, samples, 0)
        if vmstate == "I" or vmstate == "G" then   -- G: the line whose allocation ran a GC step
            d:incr("at " .. vmstate .. " " .. dumpstack(thread, "l", 1), samples, 0)
        end
    end)
end

-- GET: {name: {ns, calls}} summed over the workers; ?reset=1 empties the sums first;
-- ?raw=1: {key: value}, the profiler's counts.
function _M.report()
    local d = ngx.shared.zccp_bench_phases
    if ngx.var.arg_reset then
        d:flush_all()
        return ngx.say("{}")
    end
    if ngx.var.arg_raw then
        local out = {}
        for _, k in ipairs(d:get_keys(0)) do
            out[k] = d:get(k)
        end
        return ngx.say(require("cjson").encode(out))
    end
    local out = {}
    for _, k in ipairs(d:get_keys(0)) do
        if k:sub(-1) ~= "#" then
            out[k] = { ns = d:get(k), calls = d:get(k .. "#") }
        end
    end
    local t0 = now_ns()   -- the clock's own cost per wrapped call (two reads + two incr)
    for _ = 1, 1000 do
        add("clock", now_ns() - now_ns())
    end
    out.clock_overhead_ns = (now_ns() - t0) / 1000
    d:delete("clock")
    d:delete("clock#")
    ngx.say(require("cjson").encode(out))
end

return _M
