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
local put_header = resp_header.put

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

-- One limit's three headers, when the limit is set (lim_s: the limit as a string, made
-- once per window).
local function put_limit(r, names, limit, lim_s, used, at)
    if limit > 0 then
        put_header(r, names[1], lim_s)
        put_header(r, names[2], tostring(math_max(0, limit - used)))
        put_header(r, names[3], at)
    end
end

-- The limits' headers' values as strings: requests, input, output, input + output.
local function limit_strings(w)
    local s = w.lim_s
    if not s then
        local lims = w.lims
        s = { tostring(lims[1]), tostring(lims[2]), tostring(lims[3]), tostring(lims[2] + lims[3]) }
        w.lim_s = s
    end
    return s
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
    local r, ls = resp_header.request(), limit_strings(w)
    if api == "anthropic" then
        local at, h = resets(now).anthropic, ANTHROPIC_HEADERS
        put_limit(r, h[1], rpm, ls[1], used_requests, at)
        put_limit(r, h[2], itpm, ls[2], used_in, at)
        put_limit(r, h[3], otpm, ls[3], used_out, at)
        put_limit(r, h[4], itpm + otpm, ls[4], used_in + used_out, at)
        return
    end
    local at = resets(now).openai
    put_limit(r, OPENAI_HEADERS[1], rpm, ls[1], used_requests, at)
    put_limit(r, OPENAI_HEADERS[2], itpm + otpm, ls[4], used_in + used_out, at)
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
