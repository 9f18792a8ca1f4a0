-- The rate-limit headers of each API (zccp.plugins.limits.admit) and its 429 answers, which carry them
-- too, as the real APIs' 429s do.
--
--   headers.set(api, w, now, refused_j)   -- refused_j: the limit refused (its remaining: 0)
--   headers.refuse(api, scope_name, j, limit, retry)   -- the 429 (false)
local cjson = require "cjson.safe"
local errors = require "zccp.errors"
local metrics = require "zccp.lib.metrics"
local lease = require "zccp.plugins.limits.lease"
local resp_header = require "zccp.plugins.limits.resp_header"
local windows = require "zccp.plugins.limits.windows"

local ngx = ngx
local ngx_header = ngx.header
local tostring = tostring
local ipairs = ipairs
local pairs = pairs
local math_floor = math.floor
local math_ceil = math.ceil
local math_max = math.max
local os_date = os.date
local str_format = string.format
local put_all = resp_header.put_all

local NAMES, CONC = windows.NAMES, windows.CONC

local _M = { _VERSION = "0.1.0" }

-- The minute windows' reset, as each API writes it (Anthropic: RFC 3339; OpenAI: "12s"),
-- made once a second.
local reset_at, reset_str = -1, {}

local function resets(now)
    local sec = math_floor(now)
    if sec ~= reset_at then
        local left = 60 - sec % 60
        reset_at = sec
        reset_str.anthropic = os_date("!%Y-%m-%dT%H:%M:%SZ", sec + left)
        reset_str.openai = left < 60 and left .. "s" or "1m0s"   -- a Go duration
    end
    return reset_str
end

-- What the key's counter i has used in its window, as this worker sees it: the count in
-- Redis at its last lease, less what of that lease it has not spent (other workers'
-- spending since that lease is not seen: docs/keys.md).
local function used_of(w, i)
    local b = lease.get(w.keys[i])
    if not b then
        return 0
    end
    local used = math_max(0, b.seen - b.left)
    return used
end

-- Each API's rate-limit headers: per limit, its limit / remaining / reset names.
local function header_names(fmt, ...)
    local out = {}
    for i, what in ipairs({ ... }) do
        out[i] = { fmt:format(what, "limit"), fmt:format(what, "remaining"), fmt:format(what, "reset") }
    end
    return out
end
local ANTHROPIC_HEADERS = header_names("anthropic-ratelimit-%s-%s", "requests", "input-tokens", "output-tokens",
                                       "tokens")
local OPENAI_HEADERS = { { "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests" },
                         { "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens" } }

-- Each API's headers for window w, made once per window: names[k] and vals[k] (k = 1..n),
-- three per limit set (limit, remaining, reset); rem[m]: where limit m's remaining goes
-- (0: not set), at: the reset string vals holds. The limits: requests, input, output,
-- input + output (OpenAI: requests, tokens). vals is filled in place at each call (set()
-- does not yield, so the requests of one window can share it).
local function plan_of(w, api)
    local plans = w.header_plans
    if not plans then
        plans = {}
        w.header_plans = plans
    end
    local plan = plans[api]
    if plan then
        return plan
    end
    local lims = w.lims
    local limits = { lims[1], lims[2], lims[3], lims[2] + lims[3] }
    local strs = { tostring(lims[1]), tostring(lims[2]), tostring(lims[3]), tostring(lims[2] + lims[3]) }
    local order, names = { 1, 2, 3, 4 }, ANTHROPIC_HEADERS
    if api ~= "anthropic" then
        order, names = { 1, 4 }, OPENAI_HEADERS
    end
    plan = { names = {}, vals = {}, n = 0, rem = { 0, 0, 0, 0 }, resets = {}, at = "" }
    for o, m in ipairs(order) do
        if limits[m] > 0 then
            local n = plan.n
            for h = 1, 3 do
                plan.names[n + h] = names[o][h]
            end
            plan.vals[n + 1], plan.vals[n + 2], plan.vals[n + 3] = strs[m], "", ""
            plan.rem[m] = n + 2
            plan.resets[#plan.resets + 1] = n + 3
            plan.n = n + 3
        end
    end
    plans[api] = plan
    return plan
end

-- The rate-limit headers of the API, from the key's own limits (counters 1-3); refused:
-- the key's limit just refused (its remaining is 0), or nil.
local function set_headers(api, w, now, refused)
    local lims = w.lims
    local rpm, itpm, otpm = lims[1], lims[2], lims[3]
    local used_in, used_out = itpm > 0 and used_of(w, 2) or 0, otpm > 0 and used_of(w, 3) or 0
    local used_requests = rpm > 0 and used_of(w, 1) or 0
    if refused == 1 then
        used_requests = rpm
    elseif refused == 2 then
        used_in = itpm
    elseif refused == 3 then
        used_out = otpm
    end
    local plan = plan_of(w, api)
    local vals, rem = plan.vals, plan.rem
    local at = resets(now)[api == "anthropic" and "anthropic" or "openai"]
    if plan.at ~= at then
        local rs = plan.resets
        for k = 1, #rs do
            vals[rs[k]] = at
        end
        plan.at = at
    end
    local k = rem[1]
    if k > 0 then
        vals[k] = tostring(math_max(0, rpm - used_requests))
    end
    k = rem[2]
    if k > 0 then
        vals[k] = tostring(math_max(0, itpm - used_in))
    end
    k = rem[3]
    if k > 0 then
        vals[k] = tostring(math_max(0, otpm - used_out))
    end
    k = rem[4]
    if k > 0 then
        vals[k] = tostring(math_max(0, itpm + otpm - used_in - used_out))
    end
    put_all(resp_header.request(), plan.names, vals, plan.n)
end

local WHAT = { "requests per minute", "input tokens per minute", "output tokens per minute",
               "concurrent requests", "tokens per day", "tokens per month" }

local function refuse(api, scope_name, j, limit, retry)
    metrics.count("zccp_nginx_limited_total", api, NAMES[j])
    retry = math_max(1, math_ceil(retry))
    local msg = str_format("rate limit reached for %s: %s %d; retry in %d s", scope_name, WHAT[j], limit, retry)
    local h = { ["Retry-After"] = tostring(retry) }
    if api == "openai" then
        ngx.status = 429
        ngx_header["Content-Type"] = "application/json"
        for k, v in pairs(h) do
            ngx_header[k] = v
        end
        local quota = j >= 5
        ngx.print(cjson.encode({ error = { message = msg, type = quota and "insufficient_quota"
            or (j == 1 or j == CONC) and "requests" or "tokens", param = cjson.null,
            code = quota and "insufficient_quota" or "rate_limit_exceeded" } }))
        return false
    end
    errors.send(api, 429, "rate_limit_error", msg, h)
    return false
end

_M.set = set_headers
_M.refuse = refuse
return _M
