-- The windows of a caller's limits (zccp.plugins.limits.admit): its 12 counters (6 of the key, 6 of its
-- tenant) in the current minute, their limits, ends and TTLs, and the Redis they live in.
--
--   local w = windows.of(who, now)     -- cached on the caller's record per minute
--   windows.reset_in(j, now)           -- seconds until limit j's window resets
--   windows.limited(who)               -- whether the caller has any limit
local settings = require "zccp.settings"
local redis = require "zccp.lib.redis"

local type = type
local tonumber = tonumber
local ipairs = ipairs
local math_floor = math.floor
local math_ceil = math.ceil
local os_date = os.date

local _M = { _VERSION = "0.1.0" }

-- The limits a key or tenant record may carry, in the counters' order (6 per scope).
local NAMES = { "rpm", "itpm", "otpm", "concurrency", "daily_tokens", "monthly_tokens" }
local N = #NAMES
local CONC = 4
local DAYS = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 }

local target

local function redis_target()
    if not target then
        target = redis.target(settings.get().auth.redis)
    end
    return target
end

local function has_limits(l)
    if type(l) ~= "table" then
        return false
    end
    for _, name in ipairs(NAMES) do
        local v = tonumber(l[name])
        if v and v > 0 then
            return true
        end
    end
    return false
end

-- Whether this caller has any limit (else nothing is reserved, only metered). Kept on the
-- caller's record (zccp.plugins.auth.keys caches it per worker).
function _M.limited(who)
    if who.off then
        return false
    end
    local l = who.zccp_limited
    if l == nil then
        l = has_limits(who.limits) or has_limits(who.tenant_limits)
        who.zccp_limited = l
    end
    return l
end

-- Seconds until the window of limit `j` resets.
local function reset_in(j, now)
    if j <= 3 then
        return 60 - now % 60
    elseif j == CONC then
        return 1
    end
    local t = os_date("!*t", now)
    local left_today = 86400 - (t.hour * 3600 + t.min * 60 + t.sec)
    if j == 5 then
        return left_today
    end
    local y = t.year
    local days = DAYS[t.month]
    if t.month == 2 and (y % 4 == 0 and (y % 100 ~= 0 or y % 400 == 0)) then
        days = 29
    end
    return (days - t.day) * 86400 + left_today
end

-- A window's usage not yet sent: the same sums go to the key's and to the tenant's hash at
-- the flush (one set of additions per request, not one per hash).
local function new_acc()
    return { dirty = false, requests = 0, input_tokens = 0, output_tokens = 0, cache_hits = 0, saved_tokens = 0,
             status = {} }
end

-- The caller's counters in the current minute (12: 6 of the key, 6 of its tenant), their
-- limits (0: none), the windows' ends and the keys' TTLs; kept on the caller's record
-- and rebuilt when the minute turns (no per-request string building).
local function windows(who, now)
    local minute = math_floor(now / 60)
    local w = who.zccp_windows
    if w and w.minute == minute then
        return w
    end
    local day, month = os_date("!%Y%m%d", now), os_date("!%Y%m", now)
    local conc_ttl = math_ceil(settings.get().request_timeout_ms / 1000) * 2 + 60
    local ttl = { 120, 120, 120, conc_ttl, 2 * 86400, 32 * 86400 }
    w = { minute = minute, day = day, keys = {}, lims = {}, ends = {}, ttls = {}, names = {}, scopes = {} }
    local lims = { who.limits or {}, who.tenant_limits or {} }
    local scopes = { "k:" .. who.id, "t" }
    for s = 1, 2 do
        local p = "zccp:lim:{" .. who.tenant .. "}:" .. scopes[s] .. ":"
        local ks = { p .. "rpm:" .. minute, p .. "itpm:" .. minute, p .. "otpm:" .. minute, p .. "inflight",
                     p .. "day:" .. day, p .. "month:" .. month }
        for j = 1, N do
            local i = (s - 1) * N + j
            w.keys[i] = ks[j]
            w.lims[i] = tonumber(lims[s][NAMES[j]]) or 0
            w.ends[i] = j == CONC and 0 or now + reset_in(j, now)
            w.ttls[i] = ttl[j]
        end
        w.names[s] = s == 1 and "key " .. who.id or "tenant " .. who.tenant
        w.scopes[s] = who.tenant .. "/" .. scopes[s]
    end
    -- the leased counters (a limit set, not concurrency): what admit() and settle() walk
    local act, act_j, conc = {}, {}, {}
    for i = 1, 2 * N do
        local j = (i - 1) % N + 1
        if w.lims[i] > 0 then
            if j == CONC then
                w.exact = true
                conc[#conc + 1] = i
            else
                act[#act + 1], act_j[#act_j + 1] = i, j
            end
        end
    end
    w.act, w.act_j, w.conc = act, act_j, conc   -- conc: the concurrency counters
    w.tenant_tag = who.tenant
    w.usage = { "zccp:use:{" .. who.tenant .. "}:k:" .. who.id .. ":" .. day,
                "zccp:use:{" .. who.tenant .. "}:t:" .. day }
    w.acc = new_acc()   -- this window's usage since the last flush (settle(), flush())
    who.zccp_windows = w
    return w
end

_M.NAMES, _M.N, _M.CONC = NAMES, N, CONC
_M.target = redis_target
_M.reset_in = reset_in
_M.new_acc = new_acc
_M.of = windows
return _M
