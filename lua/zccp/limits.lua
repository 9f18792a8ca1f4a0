-- Limits by cost (auth.mode: keys; docs/keys.md): per key and per tenant, requests per
-- minute, input and output tokens per minute, requests in flight, tokens per UTC day and
-- month. Admission reserves one request, the input estimate and max_tokens as output from
-- this worker's leases of each window's budget (zccp.lease): no Redis round trip while a
-- lease lasts; a lease is one atomic script in Redis that never grants past the limit, so
-- two hosts sharing Redis hold one limit. A concurrency limit asks Redis at every admission
-- (exact). The log phase settles the reservation with the engine's exact counts (a cache
-- hit: zero model tokens) into the lease, and meters the usage; each worker sends what is
-- owed to Redis (concurrency given back, overruns, unspent leases, usage) every FLUSH_S,
-- one script per tenant. Every counter of a tenant and of its keys lives under the
-- tenant's hash tag ({<tenant>}): one Redis Cluster slot per script.
--
-- A scope refused here is refused by this worker without Redis until its window resets
-- (at most DENY_CACHE_S for token windows, which a settlement can reopen).
--
--   local ok = limits.admit(who, api, body)   -- false: answered 429/503; headers set
--   limits.observe(meta)                      -- after the relay: the engine's counts
--   limits.observe_counts(input, output)      -- an L1 hit: the counts its entry kept
--   limits.settle()                           -- log_by_lua: settle and meter (sent every 50 ms)
local cjson = require "cjson.safe"
local lrucache = require "resty.lrucache"
local settings = require "zccp.settings"
local sha256 = require "zccp.sha256"
local redis = require "zccp.redis"
local errors = require "zccp.errors"
local usage_log = require "zccp.usage_log"
local metrics = require "zccp.metrics"
local lease = require "zccp.lease"

local ngx = ngx
local ngx_now = ngx.now
local ngx_header = ngx.header
local type = type
local tonumber = tonumber
local tostring = tostring
local ipairs = ipairs
local pairs = pairs
local math_floor = math.floor
local math_ceil = math.ceil
local math_max = math.max
local math_min = math.min
local os_date = os.date
local str_format = string.format

local _M = { _VERSION = "0.2.0" }

-- The limits a key or tenant record may carry, in the counters' order (6 per scope).
local NAMES = { "rpm", "itpm", "otpm", "concurrency", "daily_tokens", "monthly_tokens" }
local N = #NAMES
local CONC = 4
local DENY_CACHE_S = 1
local DAYS = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 }
local BYTES_PER_TOKEN = 4     -- the input estimate at admission (settled with the exact count)
local USAGE_TTL_S = 40 * 86400
local NO_TOKENS = { 1, 0, 0, 0, 0, 0 }
local NONE = {}   -- count_tokens, models: a request, nothing else

-- KEYS: counters (nc), then usage hashes (nh). ARGV: nc, nh, usage ttl, a delta per counter
-- (applied only while the counter's window lives; never below 0), then per hash: the
-- number of fields, then field, n pairs.
local FLUSH = [[
local nc, nh, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
for i = 1, nc do
  local d = tonumber(ARGV[3 + i])
  if d ~= 0 and redis.call('EXISTS', KEYS[i]) == 1 then
    if redis.call('INCRBY', KEYS[i], d) < 0 then redis.call('SET', KEYS[i], 0, 'KEEPTTL') end
  end
end
local a = 4 + nc
for h = 1, nh do
  local k = KEYS[nc + h]
  local nf = tonumber(ARGV[a])
  a = a + 1
  for _ = 1, nf do
    redis.call('HINCRBY', k, ARGV[a], ARGV[a + 1])
    a = a + 2
  end
  redis.call('EXPIRE', k, ttl)
end
return 1
]]
local FLUSH_SHA = sha256.hex(ngx.sha1_bin(FLUSH), 20)

local target
local deny       -- this worker's refused scopes: scope id -> { until, which, limit }

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
-- caller's record (zccp.auth caches it per worker).
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
        local ks = { p .. "rpm:" .. minute, p .. "itpm:" .. minute, p .. "otpm:" .. minute, p .. "conc",
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
    w.tenant_tag = who.tenant
    w.usage = { "zccp:use:{" .. who.tenant .. "}:k:" .. who.id .. ":" .. day,
                "zccp:use:{" .. who.tenant .. "}:t:" .. day }
    who.zccp_windows = w
    return w
end

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
    return math_max(0, b.seen - b.left)
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

-- One limit's three headers, when the limit is set.
local function put_limit(names, limit, used, at)
    if limit > 0 then
        ngx_header[names[1]] = limit
        ngx_header[names[2]] = math_max(0, limit - used)
        ngx_header[names[3]] = at
    end
end

-- The rate-limit headers of the API, from the key's own limits (counters 1-3).
local function set_headers(api, w, now)
    local lims = w.lims
    local rpm, itpm, otpm = lims[1], lims[2], lims[3]
    local used_in, used_out = itpm > 0 and used_of(w, 2) or 0, otpm > 0 and used_of(w, 3) or 0
    local used_requests = rpm > 0 and used_of(w, 1) or 0
    if api == "anthropic" then
        local at, h = resets(now).anthropic, ANTHROPIC_HEADERS
        put_limit(h[1], rpm, used_requests, at)
        put_limit(h[2], itpm, used_in, at)
        put_limit(h[3], otpm, used_out, at)
        put_limit(h[4], itpm + otpm, used_in + used_out, at)
        return
    end
    local at = resets(now).openai
    put_limit(OPENAI_HEADERS[1], rpm, used_requests, at)
    put_limit(OPENAI_HEADERS[2], itpm + otpm, used_in + used_out, at)
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

-- The choices a body asks for: OpenAI's n, times /v1/completions' prompts (an array of
-- strings or of token-id arrays; one array of ids is one prompt). The engine bounds both.
local function choices_of(doc)
    local n = tonumber(doc.n)
    n = (n and n >= 1) and math_min(math_floor(n), 128) or 1
    local p = doc.prompt
    if type(p) == "table" and type(p[1]) ~= "number" and #p > 1 then
        n = n * math_min(#p, 128)
    end
    return n
end

-- max_tokens the body asks for (/v1/responses: max_output_tokens), else the configured
-- default, once per choice: the output reservation.
local function max_tokens_of(doc)
    local m = type(doc) == "table" and (tonumber(doc.max_tokens) or tonumber(doc.max_completion_tokens)
                                        or tonumber(doc.max_output_tokens))
    local s = settings.get().limits
    local cap = s and s.max_tokens_cap or 4096
    if not m or m < 1 then
        m = s and s.default_max_tokens or 256
    else
        m = math_min(math_floor(m), cap)
    end
    return type(doc) == "table" and m * choices_of(doc) or m
end

-- The output reservation of a body; the same bytes again (an L1 hit, a retry) are not
-- decoded again: a body string is interned, so this lookup is by pointer.
local SEEN_BODY_MAX = 4096
local seen_bodies

local function output_reservation(body)
    if not body then
        return max_tokens_of(nil)
    end
    local small = #body <= SEEN_BODY_MAX
    if small then
        if not seen_bodies then
            seen_bodies = lrucache.new(512)
        end
        local m = seen_bodies:get(body)
        if m then
            return m
        end
    end
    local m = max_tokens_of(cjson.decode(body))
    if small then
        seen_bodies:set(body, m)
    end
    return m
end

-- What this worker owes Redis, by tenant hash tag: counters' deltas (concurrency given
-- back, overruns, unspent leases) and usage hashes' increments; sent every FLUSH_S.
local FLUSH_S = 0.05
local MAX_LINES = 10000
local owed, lines, flusher = {}, {}, false

local function owed_of(tag)
    local t = owed[tag]
    if not t then
        t = { counters = {}, usage = {} }
        owed[tag] = t
    end
    return t
end

local function owe(tag, ck, d)
    if d ~= 0 then
        local c = owed_of(tag).counters
        c[ck] = (c[ck] or 0) + d
    end
end

local function flush(premature)
    lease.collect(ngx_now(), owed, premature)
    local out = lines
    lines = {}
    usage_log.write_lines(out)
    local batch = {}
    for tag, t in pairs(owed) do
        local keys, deltas, hashes = {}, {}, {}
        for ck, d in pairs(t.counters) do
            if d ~= 0 then
                keys[#keys + 1] = ck
                deltas[#deltas + 1] = d
            end
        end
        local nc = #keys
        for hk, fields in pairs(t.usage) do
            keys[#keys + 1] = hk
            local n = 0
            local args = {}
            for f, v in pairs(fields) do
                args[#args + 1] = f
                args[#args + 1] = v
                n = n + 1
            end
            hashes[#hashes + 1] = n
            for _, a in ipairs(args) do
                hashes[#hashes + 1] = a
            end
        end
        if #keys > 0 then
            local cmd = { keys[1], "EVALSHA", FLUSH_SHA, #keys }
            for _, k in ipairs(keys) do
                cmd[#cmd + 1] = k
            end
            cmd[#cmd + 1] = nc
            cmd[#cmd + 1] = #keys - nc
            cmd[#cmd + 1] = USAGE_TTL_S
            for _, d in ipairs(deltas) do
                cmd[#cmd + 1] = d
            end
            for _, a in ipairs(hashes) do
                cmd[#cmd + 1] = a
            end
            batch[#batch + 1] = cmd
        end
        owed[tag] = nil
    end
    if #batch == 0 then
        return
    end
    local failed, err = redis_target():pipeline(batch)
    if failed > 0 and err and err:find("NOSCRIPT", 1, true) then
        redis_target():call_key(batch[1][1], "SCRIPT", "LOAD", FLUSH)
        failed, err = redis_target():pipeline(batch)
    end
    if failed > 0 then
        ngx.log(ngx.ERR, "zccp: limits: ", failed, " tenant settlement(s) failed: ", err,
                premature and " (worker exiting)" or "")
    end
end

local function start_flusher()
    if flusher then
        return true
    end
    local ok, err = ngx.timer.every(FLUSH_S, flush)
    if not ok then
        ngx.log(ngx.ERR, "zccp: limits flush timer: ", err)
        return false
    end
    flusher = true
    return true
end

local MAX_ROUNDS = 3   -- lease rounds (a grant may be spent by this worker's other requests meanwhile)

-- Whether this worker's leases cover `needs` with no Redis round trip (no concurrency limit).
local function covered(w, needs)
    local keys, lims = w.keys, w.lims
    for i = 1, 2 * N do
        local j = (i - 1) % N + 1
        local need = needs[j]
        if lims[i] > 0 and need > 0 then
            if j == CONC then
                return false
            end
            local b = lease.get(keys[i])
            if not b or b.left < need then
                return false
            end
        end
    end
    return true
end

-- Take this request's needs from the leases, asking Redis for what is short (and for the
-- concurrency counts, exactly, in the first round). Returns true; or false, i, count
-- (counter i refused); or nil, err. ticket.conc: the concurrency counters counted (or nil).
local function reserve(w, needs, ticket, now)
    if covered(w, needs) then
        return true   -- the common case: nothing to ask Redis, nothing allocated
    end
    local keys, lims = w.keys, w.lims
    local t = redis_target()
    for round = 1, MAX_ROUNDS do
        local ak, al, aw, ax, att, ae = {}, {}, {}, {}, {}, {}
        local at = {}
        for i = 1, 2 * N do
            local lim = lims[i]
            local j = (i - 1) % N + 1
            if lim > 0 and needs[j] > 0 then
                local ask
                if j == CONC then
                    ask = round == 1
                else
                    local b = lease.get(keys[i])
                    ask = not b or b.left < needs[j]
                end
                if ask then
                    local n = #ak + 1
                    ak[n], al[n], aw[n], ax[n], att[n], ae[n] = keys[i], lim, needs[j], j == CONC, w.ttls[i], w.ends[i]
                    at[n] = i
                end
            end
        end
        if #ak == 0 then
            return true
        end
        local ok, k, c = lease.acquire(t, ak, al, aw, ax, att, ae, w.tenant_tag, now)
        if not ok then
            if ok == false then
                return false, at[k], c
            end
            return nil, k
        end
        if round == 1 then
            for n = 1, #ak do
                if ax[n] then
                    local counted = ticket.conc or {}
                    counted[#counted + 1] = ak[n]
                    ticket.conc = counted
                end
            end
        end
    end
    return false, nil, 0
end

-- Admit this request or answer it 429 (false). who: zccp.auth's caller. kind: nil for a
-- generation; "count_tokens" or "models": one request against the requests per minute
-- (no model tokens, no concurrency count), metered as a request.
function _M.admit(who, api, body, kind)
    if who.off then
        return true
    end
    local now = ngx_now()
    local w = windows(who, now)
    local est_in = not kind and body and math_ceil(#body / BYTES_PER_TOKEN) or 0
    local ticket = { who = who, w = w, est_in = est_in, est_out = 0, admitted = false, kind = kind,
                     api = api, request_id = ngx.var.zccp_request_id }
    ngx.ctx.zccp_limits = ticket   -- metered when the answer ends (zccp.limits.settle), refused or not
    if not _M.limited(who) then
        return true   -- nothing to reserve
    end
    if not deny then
        deny = lrucache.new(10000)
    end
    local scopes = w.scopes
    for s = 1, 2 do
        local d = deny:get(scopes[s])
        if d and d[1] > now then
            return refuse(api, w.names[s], d[2], d[3], d[1] - now)
        end
    end
    local needs = NO_TOKENS
    if not kind then
        local est_out = output_reservation(body)
        ticket.est_out = est_out
        needs = { 1, est_in, est_out, 1, est_in + est_out, est_in + est_out }
    end
    start_flusher()
    local ok, i = reserve(w, needs, ticket, now)
    if not ok then
        for _, ck in ipairs(ticket.conc or NONE) do
            owe(who.tenant, ck, -1)   -- counted in a round that did not admit: given back
        end
        if ok == nil then
            ngx.log(ngx.ERR, "zccp: limits: redis: ", i)
            return errors.send(api, 503, "overloaded_error", "the limits store is unreachable; retry shortly",
                { ["Retry-After"] = "1" })
        end
        if not i then
            return errors.send(api, 503, "overloaded_error", "limits busy; retry shortly", { ["Retry-After"] = "1" })
        end
        local s, j = i > N and 2 or 1, (i - 1) % N + 1
        local limit = w.lims[i]
        local retry = reset_in(j, now)
        if j ~= CONC then   -- a concurrency count comes back within FLUSH_S: ask again
            deny:set(scopes[s], { now + retry, j, limit }, j == 1 and retry or DENY_CACHE_S)
        end
        return refuse(api, w.names[s], j, limit, retry)
    end
    for k = 1, 2 * N do
        local j = (k - 1) % N + 1
        if w.lims[k] > 0 and j ~= CONC and needs[j] > 0 then
            lease.spend(w.keys[k], needs[j], now)
        end
    end
    ticket.admitted = true
    set_headers(api, w, now)
    return true
end

-- The engine's exact counts for this request: after the relay, its slot's meta
-- (prompt_len, completion_len); for an L1 hit, the counts its entry kept (what it saved).
function _M.observe_counts(input, output)
    local t = ngx.ctx.zccp_limits
    if t then
        t.input, t.output = tonumber(input), tonumber(output)
    end
end

function _M.observe(meta)
    return _M.observe_counts(meta.prompt_len, meta.completion_len)
end

local function add(h, f, n)
    if n ~= 0 then
        h[f] = (h[f] or 0) + n
    end
end

-- log_by_lua: settle the reservation into this worker's leases (what cannot be applied
-- there is owed to Redis) and meter this request.
function _M.settle()
    local t = ngx.ctx.zccp_limits
    if not t then
        return
    end
    ngx.ctx.zccp_limits = nil
    if not start_flusher() then
        return
    end
    local status, cache = ngx.status, ngx.var.sent_http_x_zccp_cache or ""
    local hit = cache == "HIT" or cache == "NEAR"     -- the engine's or L1's: zero model tokens
    local model = not hit and not t.kind             -- count_tokens, models: no model tokens
    local used_in = (model and t.input) or 0
    local used_out = (model and t.output) or 0
    local saved = hit and ((t.input or 0) + (t.output or 0)) or 0
    local who, w = t.who, t.w
    local tag = who.tenant
    if t.admitted then
        local d_in, d_out = t.est_in - used_in, t.est_out - used_out     -- > 0: comes back
        local back = { 0, d_in, d_out, 0, d_in + d_out, d_in + d_out }
        for k = 1, 2 * N do
            local j = (k - 1) % N + 1
            if w.lims[k] > 0 and back[j] ~= 0 and j ~= CONC then
                owe(tag, w.keys[k], -lease.refund(w.keys[k], back[j]))
            end
        end
        for _, ck in ipairs(t.conc or NONE) do
            owe(tag, ck, -1)
        end
    end
    local u = owed_of(tag).usage
    for s = 1, 2 do
        local h = u[w.usage[s]]
        if not h then
            h = {}
            u[w.usage[s]] = h
        end
        add(h, "requests", 1)
        add(h, "status_" .. status, 1)
        add(h, "input_tokens", used_in)
        add(h, "output_tokens", used_out)
        add(h, "cache_hits", hit and 1 or 0)
        add(h, "saved_tokens", saved)
    end
    metrics.count("zccp_nginx_metered_tokens_total", t.api, "input", used_in)
    metrics.count("zccp_nginx_metered_tokens_total", t.api, "output", used_out)
    metrics.count("zccp_nginx_metered_tokens_total", t.api, "saved", saved)
    if #lines < MAX_LINES then
        t.day = w.day
        lines[#lines + 1] = usage_log.line(t, status, used_in, used_out, saved, cache)
    else
        ngx.log(ngx.ERR, "zccp: limits: usage log queue full; one line dropped")
    end
end

_M.NAMES = NAMES
return _M
