-- bench/keys_cuts.py --phases: bench/jit_paths.lua's timed wrappers (the plugin phases, the
-- transport), and the key check's and the limits' own pieces inside them, in a stack with
-- keys on. Installed in init_by_lua before zccp.init requires the request path, so the
-- callers' cached locals capture the wrappers. Worker thread CPU clock (jit_paths.lua).
local jit_paths = require "jit_paths"

local ffi = require "ffi"
local C = ffi.C
local ts = ffi.new("struct zccp_timespec")
local tonumber = tonumber

local _M = {}

local function now_ns()
    C.clock_gettime(3, ts)
    return tonumber(ts.tv_sec) * 1e9 + tonumber(ts.tv_nsec)
end

local function wrap(name, fn_name, label)
    local ok, mod = pcall(require, name)
    if not ok or type(mod[fn_name]) ~= "function" then
        return
    end
    local f = mod[fn_name]
    mod[fn_name] = function(a1, a2, a3, a4, a5, a6)
        local t0 = now_ns()
        local r1, r2, r3, r4 = f(a1, a2, a3, a4, a5, a6)
        local d = ngx.shared.zccp_bench_phases
        d:incr(label, now_ns() - t0, 0)
        d:incr(label .. "#", 1, 0)
        return r1, r2, r3, r4
    end
end

function _M.install()
    -- the pieces first: the plugins' files cache some of them as locals when required
    wrap("zccp.plugins.auth.keys", "admit", "  in access: auth.admit")
    wrap("zccp.plugins.limits.reserve", "output", "  in prepare: reserve.output (the body's max_tokens)")
    wrap("zccp.plugins.limits.headers", "set", "  in prepare: rate-limit headers")
    wrap("zccp.plugins.limits.admit", "admit", "  in prepare: limits.admit (reserve.output in it)")
    wrap("zccp.plugins.limits.admit", "settle", "  in log: limits.settle")
    jit_paths.install()
end

return _M
