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
local resp_header = require "zccp.resp_header"

local ngx = ngx
local ngx_now = ngx.now
local ngx_header = ngx.header
local type = type
local tonumber = tonumber
local tostring = tostring
local ipairs = ipairs
local setmetatable = setmetatable
local pairs = pairs
local math_floor = math.floor
local math_ceil = math.ceil
local math_max = math.max
local math_min = math.min
local os_date = os.date
local str_format = string.format
local put_header = resp_header.put

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
    -- the leased counters (a limit set, not concurrency): what admit() and settle() walk
    local act, act_j = {}, {}
    for i = 1, 2 * N do
        local j = (i - 1) % N + 1
        if w.lims[i] > 0 then
            if j == CONC then
                w.exact = true
            else
                act[#act + 1], act_j[#act_j + 1] = i, j
            end
        end
    end
    w.act, w.act_j = act, act_j
    w.tenant_tag = who.tenant
    w.usage = { "zccp:use:{" .. who.tenant .. "}:k:" .. who.id .. ":" .. day,
                "zccp:use:{" .. who.tenant .. "}:t:" .. day }
    w.acc = new_acc()   -- this window's usage since the last flush (settle(), flush())
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

-- The rate-limit headers of the API, from the key's own limits (counters 1-3).
local function set_headers(api, w, now)
    local lims = w.lims
    local rpm, itpm, otpm = lims[1], lims[2], lims[3]
    local used_in, used_out = itpm > 0 and used_of(w, 2) or 0, otpm > 0 and used_of(w, 3) or 0
    local used_requests = rpm > 0 and used_of(w, 1) or 0
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

-- The choices a body asks for: OpenAI's n, times /v1/completions' prompts (an array of
-- strings or of token-id arrays; one array of ids is one prompt), at most what the engine
-- serves in one request (limits.max_choices: its MAX_CHOICES; more is refused there).
local function choices_of(doc, most)
    local n = tonumber(doc.n)
    n = (n and n >= 1) and math_floor(n) or 1
    local p = doc.prompt
    if type(p) == "table" and type(p[1]) ~= "number" and #p > 1 then
        n = n * #p
    end
    return math_min(n, most)
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
    return type(doc) == "table" and m * choices_of(doc, s and s.max_choices or 1) or m
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
local dirty = {}   -- the windows whose usage sums (w.acc) have not been sent
-- Tokens metered by API since the last flush (input, output, saved): into the Prometheus
-- counters (zccp_nginx_metered_tokens_total) at each flush; three additions per request,
-- no call (most of a request's Lua is interpreted: a call costs more than the sums).
local metered = { anthropic = { 0, 0, 0 }, openai = { 0, 0, 0 } }
local METERED = { "input", "output", "saved" }
local STATUS_FIELD = setmetatable({}, { __index = function(t, status)
    local f = "status_" .. status
    t[status] = f
    return f
end })

local function add(h, f, n)
    if n ~= 0 then
        h[f] = (h[f] or 0) + n
    end
end

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

-- The windows' usage sums into `owed` (each into its key's and its tenant's hash), and the
-- metered tokens into their counters; the sums start again from zero.
local function fold_usage()
    local ws = dirty
    dirty = {}
    for n = 1, #ws do
        local w = ws[n]
        local acc = w.acc
        w.acc = new_acc()
        local u = owed_of(w.tenant_tag).usage
        for s = 1, 2 do
            local h = u[w.usage[s]]
            if not h then
                h = {}
                u[w.usage[s]] = h
            end
            add(h, "requests", acc.requests)
            for status, c in pairs(acc.status) do
                add(h, STATUS_FIELD[status], c)
            end
            add(h, "input_tokens", acc.input_tokens)
            add(h, "output_tokens", acc.output_tokens)
            add(h, "cache_hits", acc.cache_hits)
            add(h, "saved_tokens", acc.saved_tokens)
        end
    end
    for api, m in pairs(metered) do
        for k = 1, 3 do
            if m[k] ~= 0 then
                metrics.count("zccp_nginx_metered_tokens_total", api, METERED[k], m[k])
                m[k] = 0
            end
        end
    end
end

local function flush(premature)
    fold_usage()
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
    if w.exact and needs[CONC] > 0 then
        return false   -- counted in Redis at every admission
    end
    local keys, act, act_j = w.keys, w.act, w.act_j
    for a = 1, #act do
        local need = needs[act_j[a]]
        if need > 0 then
            local b = lease.get(keys[act[a]])
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

-- The refusals this worker remembers (deny) all end before this time: until then, no lookup.
local denied_until = 0

-- A request's needs while nothing yields (the leases cover them): filled in place, no table
-- per request. Indexes as NAMES: requests, input, output, in flight, day, month.
local NEEDS = { 1, 0, 0, 1, 0, 0 }

-- Admit this request or answer it 429 (false). who: zccp.auth's caller. kind: nil for a
-- generation; "count_tokens" or "models": one request against the requests per minute
-- (no model tokens, no concurrency count), metered as a request. rid: the request id (for
-- the usage line; nil: read from ngx.var when the line is made).
function _M.admit(who, api, body, kind, rid)
    if who.off then
        return true
    end
    local now = ngx_now()
    local w = windows(who, now)
    local est_in = not kind and body and math_ceil(#body / BYTES_PER_TOKEN) or 0
    local ticket = { who = who, w = w, est_in = est_in, est_out = 0, admitted = false, kind = kind, api = api,
                     rid = rid }
    ngx.ctx.zccp_limits = ticket   -- metered when the answer ends (zccp.limits.settle), refused or not
    if not _M.limited(who) then
        return true   -- nothing to reserve
    end
    local scopes = w.scopes
    if now < denied_until then
        for s = 1, 2 do
            local d = deny:get(scopes[s])
            if d and d[1] > now then
                return refuse(api, w.names[s], d[2], d[3], d[1] - now)
            end
        end
    end
    local needs = NO_TOKENS
    if not kind then
        local est_out = output_reservation(body)
        ticket.est_out = est_out
        needs = NEEDS
        needs[2], needs[3], needs[5], needs[6] = est_in, est_out, est_in + est_out, est_in + est_out
    end
    start_flusher()
    if not covered(w, needs) then
        if needs == NEEDS then   -- reserve() yields: this request's own copy
            needs = { 1, NEEDS[2], NEEDS[3], 1, NEEDS[5], NEEDS[6] }
        end
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
                return errors.send(api, 503, "overloaded_error", "limits busy; retry shortly",
                    { ["Retry-After"] = "1" })
            end
            local s, j = i > N and 2 or 1, (i - 1) % N + 1
            local limit = w.lims[i]
            local retry = reset_in(j, now)
            if j ~= CONC then   -- a concurrency count comes back within FLUSH_S: ask again
                if not deny then
                    deny = lrucache.new(10000)
                end
                deny:set(scopes[s], { now + retry, j, limit }, j == 1 and retry or DENY_CACHE_S)
                denied_until = math_max(denied_until, now + retry)
            end
            return refuse(api, w.names[s], j, limit, retry)
        end
    end
    local keys, act, act_j = w.keys, w.act, w.act_j
    for a = 1, #act do
        local need = needs[act_j[a]]
        if need > 0 then
            lease.spend(keys[act[a]], need, now)
        end
    end
    ticket.admitted = true
    set_headers(api, w, now)
    return true
end

-- The engine's exact counts for this request: after the relay, its slot's meta
-- (prompt_len, completion_len) and the cache verdict it sent (X-ZCCP-Cache, or nil); for
-- an L1 hit, the counts its entry kept (what it saved) and "HIT".
function _M.observe_counts(input, output, cache)
    local t = ngx.ctx.zccp_limits
    if t then
        t.input, t.output, t.cache = tonumber(input), tonumber(output), cache
    end
end

function _M.observe(meta, cache)
    return _M.observe_counts(meta.prompt_len, meta.completion_len, cache)
end

-- log_by_lua: settle the reservation into this worker's leases (what cannot be applied
-- there is owed to Redis) and meter this request (added to its window's sums, sent by
-- the flush).
function _M.settle()
    local ctx = ngx.ctx
    local t = ctx.zccp_limits
    if not t then
        return
    end
    ctx.zccp_limits = nil
    if not start_flusher() then
        return
    end
    local status, cache = ngx.status, t.cache
    local hit = cache == "HIT" or cache == "NEAR"     -- the engine's or L1's: zero model tokens
    local model = not hit and not t.kind             -- count_tokens, models: no model tokens
    local used_in = (model and t.input) or 0
    local used_out = (model and t.output) or 0
    local saved = hit and ((t.input or 0) + (t.output or 0)) or 0
    local w = t.w
    if t.admitted then
        local tag = t.who.tenant
        local d_in, d_out = t.est_in - used_in, t.est_out - used_out     -- > 0: comes back
        if d_in ~= 0 or d_out ~= 0 then
            local keys, act, act_j = w.keys, w.act, w.act_j
            for a = 1, #act do
                local j = act_j[a]
                local back = j == 2 and d_in or j == 3 and d_out or j >= 5 and d_in + d_out or 0
                if back ~= 0 then
                    local ck = keys[act[a]]
                    owe(tag, ck, -lease.refund(ck, back))
                end
            end
        end
        if t.conc then
            for _, ck in ipairs(t.conc) do
                owe(tag, ck, -1)
            end
        end
    end
    local acc = w.acc
    if not acc.dirty then
        acc.dirty = true
        dirty[#dirty + 1] = w
    end
    acc.requests = acc.requests + 1
    acc.status[status] = (acc.status[status] or 0) + 1
    acc.input_tokens = acc.input_tokens + used_in
    acc.output_tokens = acc.output_tokens + used_out
    if hit then
        acc.cache_hits = acc.cache_hits + 1
    end
    acc.saved_tokens = acc.saved_tokens + saved
    local m = metered[t.api]
    if m then
        m[1], m[2], m[3] = m[1] + used_in, m[2] + used_out, m[3] + saved
    end
    if usage_log.enabled() then
        if #lines < MAX_LINES then
            lines[#lines + 1] = usage_log.line(t, t.rid or ngx.var.zccp_request_id, status, used_in, used_out, saved,
                                               cache)
        else
            ngx.log(ngx.ERR, "zccp: limits: usage log queue full; one line dropped")
        end
    end
end

_M.NAMES = NAMES
return _M
