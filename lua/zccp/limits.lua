-- Limits by cost (auth.mode: keys; docs/keys.md): per key and per tenant, requests per
-- minute, input and output tokens per minute, requests in flight, tokens per UTC day and
-- month. One Redis script admits a request (checks every limit, then reserves: one request,
-- the input estimate, max_tokens as output) atomically, so two hosts sharing Redis hold one
-- limit; the log phase settles the reservation with the engine's exact counts (a cache hit:
-- zero model tokens) and meters the usage. Every counter of a tenant and of its keys lives
-- under the tenant's hash tag ({t:<tenant>}): one Redis Cluster slot per script.
--
-- Fast path: a scope refused here is refused by this worker without Redis until its
-- window resets (at most DENY_CACHE_S for token windows, which a settlement can reopen).
--
--   local ok = limits.admit(who, api, body)   -- false: answered 429/503; headers set
--   limits.observe(meta)                      -- after the relay: the engine's counts
--   limits.settle()                           -- log_by_lua: queue the settlement (sent every 50 ms)
local cjson = require "cjson.safe"
local lrucache = require "resty.lrucache"
local settings = require "zccp.settings"
local sha256 = require "zccp.sha256"
local redis = require "zccp.redis"
local errors = require "zccp.errors"
local usage_log = require "zccp.usage_log"
local metrics = require "zccp.metrics"

local ngx = ngx
local ngx_now = ngx.now
local ngx_header = ngx.header
local type = type
local tonumber = tonumber
local tostring = tostring
local ipairs = ipairs
local pairs = pairs
local unpack = unpack
local math_floor = math.floor
local math_ceil = math.ceil
local math_max = math.max
local math_min = math.min
local os_date = os.date
local str_format = string.format

local _M = { _VERSION = "0.1.0" }

-- The limits a key or tenant record may carry, in the scripts' order.
local NAMES = { "rpm", "itpm", "otpm", "concurrency", "daily_tokens", "monthly_tokens" }
local N = #NAMES
local DENY_CACHE_S = 1
local DAYS = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 }
local BYTES_PER_TOKEN = 4     -- the input estimate at admission (settled with the exact count)

-- KEYS: 6 per scope (rpm, itpm, otpm, concurrency, day, month counters).
-- ARGV: in, out, nscopes, ttl_minute, ttl_day, ttl_month, ttl_conc, then 6 limits per scope.
-- Returns {0, scope, which, current} when a limit would be passed, else {1, counts...}
-- (each scope's 6 counters after the reservation).
local ADMIT = [[
local add_in, add_out, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local ttl = {tonumber(ARGV[4]), tonumber(ARGV[4]), tonumber(ARGV[4]), tonumber(ARGV[7]),
             tonumber(ARGV[5]), tonumber(ARGV[6])}
local adds = {1, add_in, add_out, 1, add_in + add_out, add_in + add_out}
local cur = {}
for s = 0, n - 1 do
  for j = 1, 6 do
    local lim = tonumber(ARGV[7 + s * 6 + j])
    local c = 0
    if lim > 0 then
      c = tonumber(redis.call('GET', KEYS[s * 6 + j]) or '0')
      if c + adds[j] > lim then return {0, s, j, c} end
    end
    cur[s * 6 + j] = c
  end
end
for s = 0, n - 1 do
  for j = 1, 6 do
    if tonumber(ARGV[7 + s * 6 + j]) > 0 then
      local k = KEYS[s * 6 + j]
      cur[s * 6 + j] = redis.call('INCRBY', k, adds[j])
      redis.call('EXPIRE', k, ttl[j])
    end
  end
end
return {1, unpack(cur)}
]]

-- KEYS: the admission's counters (6 per scope), then one usage hash per scope.
-- ARGV: delta in, delta out, nscopes, limited flags (6 per scope), then usage fields:
-- input, output, cached, saved, status, usage ttl.
local SETTLE = [[
local d_in, d_out, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local deltas = {0, d_in, d_out, -1, d_in + d_out, d_in + d_out}
for s = 0, n - 1 do
  for j = 2, 6 do
    if ARGV[3 + s * 6 + j] == '1' and deltas[j] ~= 0 then
      local k = KEYS[s * 6 + j]
      if redis.call('EXISTS', k) == 1 then
        local v = redis.call('INCRBY', k, deltas[j])
        if v < 0 then redis.call('SET', k, 0, 'KEEPTTL') end
      end
    end
  end
end
local u = 3 + n * 6
for s = 0, n - 1 do
  local h = KEYS[n * 6 + 1 + s]
  redis.call('HINCRBY', h, 'requests', 1)
  redis.call('HINCRBY', h, 'status_' .. ARGV[u + 5], 1)
  if ARGV[u + 1] ~= '0' then redis.call('HINCRBY', h, 'input_tokens', ARGV[u + 1]) end
  if ARGV[u + 2] ~= '0' then redis.call('HINCRBY', h, 'output_tokens', ARGV[u + 2]) end
  if ARGV[u + 3] ~= '0' then redis.call('HINCRBY', h, 'cache_hits', ARGV[u + 3]) end
  if ARGV[u + 4] ~= '0' then redis.call('HINCRBY', h, 'saved_tokens', ARGV[u + 4]) end
  redis.call('EXPIRE', h, tonumber(ARGV[u + 6]))
end
return 1
]]
local ADMIT_SHA = sha256.hex(ngx.sha1_bin(ADMIT), 20)
local SETTLE_SHA = sha256.hex(ngx.sha1_bin(SETTLE), 20)

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

-- Whether this caller has any limit (else nothing is reserved, only metered).
function _M.limited(who)
    return not who.off and (has_limits(who.limits) or has_limits(who.tenant_limits))
end

local function eval(sha, script, nkeys, keys, args)
    local t = redis_target()
    local flat = { "EVALSHA", sha, nkeys }
    for i = 1, nkeys do
        flat[#flat + 1] = keys[i]
    end
    for i = 1, #args do
        flat[#flat + 1] = args[i]
    end
    local res, err = t:call_key(keys[1], unpack(flat))
    if err and err:find("NOSCRIPT", 1, true) then
        flat[1], flat[2] = "EVAL", script
        res, err = t:call_key(keys[1], unpack(flat))
    end
    return res, err
end

-- The counters of one scope ("k:<key id>" or "t") in the tenant's hash tag.
local function scope_keys(tag, scope, minute, day, month)
    local p = "zccp:lim:{" .. tag .. "}:" .. scope .. ":"
    return { p .. "rpm:" .. minute, p .. "itpm:" .. minute, p .. "otpm:" .. minute, p .. "conc",
             p .. "day:" .. day, p .. "month:" .. month }
end

-- Seconds until the window of limit `j` resets.
local function reset_in(j, now)
    if j <= 3 then
        return 60 - now % 60
    elseif j == 4 then
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

local function rfc3339(t)
    return os_date("!%Y-%m-%dT%H:%M:%SZ", math_floor(t))
end

local function go_duration(s)   -- OpenAI's reset headers: "1s", "6m0s"
    s = math_ceil(s)
    if s < 60 then
        return s .. "s"
    end
    return math_floor(s / 60) .. "m" .. (s % 60) .. "s"
end

-- The rate-limit headers of the API, from scope 0's (the key's) limits and counters.
local function set_headers(api, lim, counts, now)
    local rpm, tpm = tonumber(lim.rpm) or 0, (tonumber(lim.itpm) or 0) + (tonumber(lim.otpm) or 0)
    local reset = 60 - now % 60
    if api == "anthropic" then
        if rpm > 0 then
            ngx_header["anthropic-ratelimit-requests-limit"] = rpm
            ngx_header["anthropic-ratelimit-requests-remaining"] = math_max(0, rpm - counts[1])
            ngx_header["anthropic-ratelimit-requests-reset"] = rfc3339(now + reset)
        end
        for _, x in ipairs({ { "input-tokens", "itpm", 2 }, { "output-tokens", "otpm", 3 } }) do
            local l = tonumber(lim[x[2]]) or 0
            if l > 0 then
                ngx_header["anthropic-ratelimit-" .. x[1] .. "-limit"] = l
                ngx_header["anthropic-ratelimit-" .. x[1] .. "-remaining"] = math_max(0, l - counts[x[3]])
                ngx_header["anthropic-ratelimit-" .. x[1] .. "-reset"] = rfc3339(now + reset)
            end
        end
        if tpm > 0 then
            local used = ((tonumber(lim.itpm) or 0) > 0 and counts[2] or 0)
                + ((tonumber(lim.otpm) or 0) > 0 and counts[3] or 0)
            ngx_header["anthropic-ratelimit-tokens-limit"] = tpm
            ngx_header["anthropic-ratelimit-tokens-remaining"] = math_max(0, tpm - used)
            ngx_header["anthropic-ratelimit-tokens-reset"] = rfc3339(now + reset)
        end
        return
    end
    if rpm > 0 then
        ngx_header["x-ratelimit-limit-requests"] = rpm
        ngx_header["x-ratelimit-remaining-requests"] = math_max(0, rpm - counts[1])
        ngx_header["x-ratelimit-reset-requests"] = go_duration(reset)
    end
    if tpm > 0 then
        local used = ((tonumber(lim.itpm) or 0) > 0 and counts[2] or 0)
            + ((tonumber(lim.otpm) or 0) > 0 and counts[3] or 0)
        ngx_header["x-ratelimit-limit-tokens"] = tpm
        ngx_header["x-ratelimit-remaining-tokens"] = math_max(0, tpm - used)
        ngx_header["x-ratelimit-reset-tokens"] = go_duration(reset)
    end
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
            or (j == 1 or j == 4) and "requests" or "tokens", param = cjson.null,
            code = quota and "insufficient_quota" or "rate_limit_exceeded" } }))
        return false
    end
    errors.send(api, 429, "rate_limit_error", msg, h)
    return false
end

-- max_tokens the body asks for (the output reservation; /v1/responses: max_output_tokens),
-- else the configured default.
local function max_tokens_of(doc)
    local m = type(doc) == "table" and (tonumber(doc.max_tokens) or tonumber(doc.max_completion_tokens)
                                        or tonumber(doc.max_output_tokens))
    local s = settings.get().limits
    local cap = s and s.max_tokens_cap or 4096
    if not m or m < 1 then
        return s and s.default_max_tokens or 256
    end
    return math_min(math_floor(m), cap)
end

-- Admit this request or answer it 429 (false). who: zccp.auth's caller.
function _M.admit(who, api, body)
    if who.off then
        return true
    end
    local now = ngx_now()
    local ctx = ngx.ctx
    local lims = { who.limits or {}, who.tenant_limits or {} }
    local ids = { "k:" .. who.id, "t" }
    local names = { "key " .. who.id, "tenant " .. who.tenant }
    local minute = math_floor(now / 60)
    local day, month = os_date("!%Y%m%d", now), os_date("!%Y%m", now)
    local keys, flags = {}, {}
    local est_in = body and math_ceil(#body / BYTES_PER_TOKEN) or 0
    local args = { est_in, 0, 2, 120, 2 * 86400, 32 * 86400,
                   math_ceil(settings.get().request_timeout_ms / 1000) * 2 + 60 }
    for s = 1, 2 do
        for _, k in ipairs(scope_keys(who.tenant, ids[s], minute, day, month)) do
            keys[#keys + 1] = k
        end
        for _, name in ipairs(NAMES) do
            local v = tonumber(lims[s][name]) or 0
            args[#args + 1] = v
            flags[#flags + 1] = v > 0 and "1" or "0"
        end
    end
    local ticket = { who = who, keys = keys, flags = flags, est_in = est_in, est_out = 0, admitted = false,
                     api = api, day = day, request_id = ngx.var.zccp_request_id }
    ctx.zccp_limits = ticket   -- metered when the answer ends (zccp.limits.settle), refused or not
    if not _M.limited(who) then
        return true   -- nothing to reserve
    end
    if not deny then
        deny = lrucache.new(10000)
    end
    for s = 1, 2 do
        local d = deny:get(who.tenant .. "/" .. ids[s])
        if d and d[1] > now then
            return refuse(api, names[s], d[2], d[3], d[1] - now)
        end
    end
    ticket.est_out = max_tokens_of(body and cjson.decode(body))
    args[2] = ticket.est_out
    local res, err = eval(ADMIT_SHA, ADMIT, #keys, keys, args)
    if not res then
        ngx.log(ngx.ERR, "zccp: limits: redis: ", err)
        return errors.send(api, 503, "overloaded_error", "the limits store is unreachable; retry shortly",
            { ["Retry-After"] = "1" })
    end
    if res[1] == 0 then
        local s, j = res[2] + 1, res[3]
        local limit = tonumber(lims[s][NAMES[j]])
        local retry = reset_in(j, now)
        deny:set(who.tenant .. "/" .. ids[s], { now + retry, j, limit }, j == 1 and retry or DENY_CACHE_S)
        return refuse(api, names[s], j, limit, retry)
    end
    ticket.admitted = true
    local counts = {}
    for j = 1, N do
        counts[j] = tonumber(res[1 + j]) or 0
    end
    set_headers(api, lims[1], counts, now)
    return true
end

-- After the relay: the engine's exact counts for this request (its slot's meta).
function _M.observe(meta)
    local t = ngx.ctx.zccp_limits
    if not t then
        return
    end
    t.input, t.output = tonumber(meta.prompt_len), tonumber(meta.completion_len)
end

-- Settlements wait in this worker's queue and go to Redis together, every FLUSH_S (one
-- pipelined write on one server): a request costs no timer and no round trip of its own.
-- A concurrency slot is therefore given back up to FLUSH_S after its answer ends.
local FLUSH_S = 0.05
local MAX_QUEUE = 10000
local queue, lines, flusher = {}, {}, false

local function settle_cmd(t, status, cache)
    local hit = cache == "HIT" or cache == "NEAR"     -- the engine's or L1's: zero model tokens
    local used_in = (not hit and t.input) or 0
    local used_out = (not hit and t.output) or 0
    local saved = hit and ((t.input or 0) + (t.output or 0)) or 0
    local d_in, d_out = 0, 0
    if t.admitted then
        d_in, d_out = used_in - t.est_in, used_out - t.est_out
    end
    local who = t.who
    local cmd = { t.keys[1], "EVALSHA", SETTLE_SHA, #t.keys + 2 }
    for i = 1, #t.keys do
        cmd[#cmd + 1] = t.keys[i]
    end
    for _, s in ipairs({ "k:" .. who.id, "t" }) do
        cmd[#cmd + 1] = "zccp:use:{" .. who.tenant .. "}:" .. s .. ":" .. t.day
    end
    cmd[#cmd + 1] = d_in
    cmd[#cmd + 1] = d_out
    cmd[#cmd + 1] = 2
    for i = 1, #t.flags do
        cmd[#cmd + 1] = t.admitted and t.flags[i] or "0"
    end
    for _, v in ipairs({ used_in, used_out, hit and 1 or 0, saved, status, 40 * 86400 }) do
        cmd[#cmd + 1] = v
    end
    metrics.count("zccp_nginx_metered_tokens_total", t.api, "input", used_in)
    metrics.count("zccp_nginx_metered_tokens_total", t.api, "output", used_out)
    metrics.count("zccp_nginx_metered_tokens_total", t.api, "saved", saved)
    lines[#lines + 1] = usage_log.line(t, status, used_in, used_out, saved, cache)
    return cmd
end

local function flush(premature)
    if #queue == 0 then
        return
    end
    local batch, out = queue, lines
    queue, lines = {}, {}
    usage_log.write_lines(out)
    local failed, err = redis_target():pipeline(batch)
    if failed > 0 and err and err:find("NOSCRIPT", 1, true) then
        redis_target():call_key(batch[1][1], "SCRIPT", "LOAD", SETTLE)
        for i = 1, #batch do
            batch[i][3] = SETTLE_SHA
        end
        failed, err = redis_target():pipeline(batch)
    end
    if failed > 0 then
        ngx.log(ngx.ERR, "zccp: limits: ", failed, " settlement(s) failed: ", err,
                premature and " (worker exiting)" or "")
    end
end

-- log_by_lua: queue the settlement of the reservation and the metering of this request.
function _M.settle()
    local t = ngx.ctx.zccp_limits
    if not t then
        return
    end
    ngx.ctx.zccp_limits = nil
    if not flusher then
        local ok, err = ngx.timer.every(FLUSH_S, flush)
        if not ok then
            ngx.log(ngx.ERR, "zccp: limits flush timer: ", err)
            return
        end
        flusher = true
    end
    if #queue >= MAX_QUEUE then
        ngx.log(ngx.ERR, "zccp: limits: settlement queue full; one request not metered")
        return
    end
    queue[#queue + 1] = settle_cmd(t, ngx.status, ngx.var.sent_http_x_zccp_cache or "")
end

_M.NAMES = NAMES
return _M
