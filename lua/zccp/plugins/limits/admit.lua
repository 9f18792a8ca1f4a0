-- Limits by cost (auth.mode: keys; docs/keys.md): per key and per tenant, requests per
-- minute, input and output tokens per minute, requests in flight, tokens per UTC day and
-- month. Admission reserves one request, the input estimate and max_tokens as output from
-- this worker's leases of each window's budget (zccp.plugins.limits.lease): no Redis round trip while a
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
-- The request's record (who asks, for what, the engine's counts, plugins' usage fields)
-- lives on r as r.limits, from admission to the log phase.
--
--   local ok, t = limits.admit(r)     -- false: answered 429/503, its headers set;
--                                     -- t: an admitted reservation (its headers:
--                                     -- plugins/ratelimit_headers)
--   limits.observe(r, meta, cache, outcome, res)   -- after the relay: the engine's counts
--   limits.settle(r)                  -- the log phase: settle and meter (sent in batches)
--   (an answer a plugin served itself, an L1 hit, leaves its counts in r.served)
local errors = require "zccp.errors"
local usage_log = require "zccp.plugins.limits.usage_log"
local lease = require "zccp.plugins.limits.lease"
local lrucache = require "resty.lrucache"
local windows = require "zccp.plugins.limits.windows"
local headers = require "zccp.plugins.limits.headers"
local reserve = require "zccp.plugins.limits.reserve"
local flush = require "zccp.plugins.limits.flush"

local ngx = ngx
local ngx_now = ngx.now
local tonumber = tonumber
local ipairs = ipairs
local math_ceil = math.ceil
local math_max = math.max

local N, CONC, NAMES = windows.N, windows.CONC, windows.NAMES
local reset_in, refuse, owe, metered = windows.reset_in, headers.refuse, flush.owe, flush.metered
local flush_started = false   -- this worker's flush timer runs (settle: no call per request once it does)

local _M = { _VERSION = "0.3.0" }

local DENY_CACHE_S = 1
local BYTES_PER_TOKEN = 4     -- the input estimate at admission (settled with the exact count)
local NO_TOKENS = { 1, 0, 0, 0, 0, 0 }
local NONE = {}   -- count_tokens, models: a request, nothing else
local deny        -- this worker's refused scopes: scope id -> { until, which, limit }

_M.limited = windows.limited


-- The refusals this worker remembers (deny) all end before this time: until then, no lookup.
local denied_until = 0

-- A request's needs while nothing yields (the leases cover them): filled in place, no table
-- per request. Indexes as NAMES: requests, input, output, in flight, day, month.
local NEEDS = { 1, 0, 0, 1, 0, 0 }

-- Admit request r or answer it 429 (false). r.who: the auth plugin's caller. r.kind: nil
-- for a generation; "count_tokens" or "models": one request against the requests per
-- minute (no model tokens, no concurrency count), metered as a request.
function _M.admit(r)
    local who, api, body, kind, rid = r.who, r.api, r.body, r.kind, r.request_id
    if who.off then
        return true
    end
    local now = ngx_now()
    local w = windows.of(who, now)
    if not _M.limited(who) then   -- nothing to reserve: only metered when the answer ends (settle)
        r.limits = { who = who, w = w, admitted = false, kind = kind, api = api, rid = rid }
        return true
    end
    local est_in = not kind and body and math_ceil(#body / BYTES_PER_TOKEN) or 0
    local ticket = { who = who, w = w, est_in = est_in, est_out = 0, admitted = false, kind = kind, api = api,
                     rid = rid }
    r.limits = ticket   -- metered when the answer ends (settle), refused or not
    local scopes = w.scopes
    if now < denied_until then
        for s = 1, 2 do
            local d = deny:get(scopes[s])
            if d and d[1] > now then
                headers.set(api, w, now, s == 1 and d[2])   -- a 429 carries the limits too
                return refuse(api, w.names[s], d[2], d[3], d[1] - now)
            end
        end
    end
    local needs = NO_TOKENS
    if not kind then
        local est_out, err = reserve.output(body, api)
        if not est_out then   -- never reserved at a default: the engine may read it otherwise
            return errors.send(api, 400, "invalid_request_error", "request body: " .. err)
        end
        ticket.est_out = est_out
        needs = NEEDS
        needs[2], needs[3], needs[5], needs[6] = est_in, est_out, est_in + est_out, est_in + est_out
    end
    flush.start()
    if reserve.covered(w, needs) then
        if w.exact and needs[CONC] > 0 then
            reserve.take_spare(w, ticket, now)
        end
    else
        if needs == NEEDS then   -- reserve() yields: this request's own copy
            needs = { 1, NEEDS[2], NEEDS[3], 1, NEEDS[5], NEEDS[6] }
        end
        local ok, i = reserve.take(w, needs, ticket, now)
        if not ok then
            for _, ck in ipairs(ticket.conc or NONE) do
                if lease.conc_release(ck, now) then   -- counted in a round that did not admit: given back
                    flush.now()
                end
            end
            if ticket.undo then
                flush.undo(who.tenant, ticket.undo, ticket.undo_keys)
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
            headers.set(api, w, now, s == 1 and j)
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
    ticket.at = now   -- the rate-limit headers' clock (plugins/ratelimit_headers)
    return true, ticket
end

-- The engine's exact counts for this request: after the relay, its slot's meta
-- (prompt_len, completion_len) and the cache verdict it sent (X-ZCCP-Cache, or nil); for
-- an L1 hit, the counts its entry kept (what it saved) and "HIT".
function _M.observe_counts(r, input, output, cache)
    local t = r.limits
    if t then
        t.input, t.output, t.cache = tonumber(input), tonumber(output), cache
    end
end

-- outcome, res: the relay's (zccp.core.relay.run). A stream that ended before its end is settled
-- with the output tokens of the bytes sent to the client (the engine's committed mark),
-- not what the engine went on to generate, nor 0. A whole answer that ended before its end
-- (its client gone, its deadline) with what the engine had generated by then: it counts
-- meta.completion_len up as it generates, and stops at its next step once hung up.
function _M.observe(r, meta, cache, outcome, res)
    local out = meta.completion_len
    if outcome and outcome ~= "done" and res and res.sse then
        out = res.sent_tokens or 0
    end
    return _M.observe_counts(r, meta.prompt_len, out, cache)
end

-- The log phase: settle the reservation into this worker's leases (what cannot be applied
-- there is owed to Redis) and meter this request (added to its window's sums, sent by
-- the flush). An answer a plugin served (r.served: an L1 hit) brings its own counts.
function _M.settle(r)
    local t = r.limits
    if not t then
        return
    end
    r.limits = nil
    local served = r.served
    if served then
        t.input, t.output, t.cache = served.input, served.output, served.cache
    end
    if not flush_started and not flush.start() then
        return
    end
    flush_started = true
    local status, cache = ngx.status, t.cache
    local hit = cache == "HIT" or cache == "NEAR"     -- the engine's or L1's: zero model tokens
    local model = not hit and not t.kind             -- count_tokens, models: no model tokens
    local used_in = (model and t.input) or 0
    local used_out = (model and t.output) or 0
    local saved = hit and ((t.input or 0) + (t.output or 0)) or 0
    local w = t.w
    if t.admitted then
        local tag, overrun = t.who.tenant, false
        local d_in, d_out = t.est_in - used_in, t.est_out - used_out     -- > 0: comes back
        if d_in ~= 0 or d_out ~= 0 then
            local keys, act, act_j = w.keys, w.act, w.act_j
            for a = 1, #act do
                local j = act_j[a]
                local back = j == 2 and d_in or j == 3 and d_out or j >= 5 and d_in + d_out or 0
                if back ~= 0 then
                    local ck = keys[act[a]]
                    local rest = lease.refund(ck, back)
                    owe(tag, ck, -rest)   -- what the lease cannot take: to Redis
                    overrun = overrun or rest < 0
                end
            end
        end
        if t.conc then
            local now = ngx_now()
            for _, ck in ipairs(t.conc) do
                -- given back at once, not with the 50 ms batch: a client's next request
                -- (to another worker, maybe) must not find this one still counted
                overrun = lease.conc_release(ck, now) or overrun
            end
        end
        if overrun then
            flush.now()   -- an overrun (or a slot) reaches Redis before the next lease, not FLUSH_S later
        end
    end
    local acc = w.acc
    if not acc.dirty then   -- the window's first request since the last flush
        flush.dirty(w)
    end
    acc.requests = acc.requests + 1
    acc.status[status] = (acc.status[status] or 0) + 1
    acc.input_tokens = acc.input_tokens + used_in
    acc.output_tokens = acc.output_tokens + used_out
    if hit then
        acc.cache_hits = acc.cache_hits + 1
    end
    acc.saved_tokens = acc.saved_tokens + saved
    if used_in ~= 0 or used_out ~= 0 or saved ~= 0 then
        local m = metered[t.api]
        if m then
            m[1], m[2], m[3] = m[1] + used_in, m[2] + used_out, m[3] + saved
        end
    end
    if usage_log.enabled() then
        flush.line(usage_log.line(t, t.rid or ngx.var.zccp_request_id, status, used_in, used_out, saved, cache))
    end
end

_M.NAMES = NAMES
return _M