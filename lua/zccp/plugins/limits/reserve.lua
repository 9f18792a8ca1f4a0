-- What a request reserves (zccp.plugins.limits.admit): its output budget, decided by the engine's own
-- rule, and the lease rounds that take it from Redis when this worker's leases fall short.
--
--   local m, err = reserve.output(body, api)   -- nil, err: a body nginx cannot decode
--   reserve.covered(w, needs)                  -- the leases cover needs (no Redis)
--   local ok, i, c = reserve.take(w, needs, ticket, now)
local cjson = require "cjson.safe"
local settings = require "zccp.settings"
local lease = require "zccp.plugins.limits.lease"
local windows = require "zccp.plugins.limits.windows"
local body_fields = require "zccp.plugins.limits.body_fields"

local type = type
local tonumber = tonumber
local math_floor = math.floor
local math_min = math.min

local N, CONC = windows.N, windows.CONC
local redis_target = windows.target

local _M = { _VERSION = "0.1.0" }

-- The output budget of a body, by the engine's rule (zccp/api): OpenAI's
-- max_completion_tokens over max_tokens (JSON null: absent), /v1/responses'
-- max_output_tokens, Anthropic's max_tokens only; else the configured default; capped as
-- the engine caps it, once per choice: OpenAI's n, times /v1/completions' prompts (an array
-- of strings or of token-id arrays; one array of ids is one prompt), at most what the
-- engine serves in one request (limits.max_choices: its MAX_CHOICES; more is refused there).
-- The members as tonumber(doc.member) gives them; prompts: #doc.prompt when it counts, else 0.
local function budget(api, max_tokens, max_completion_tokens, max_output_tokens, n, prompts)
    local s = settings.get().limits
    local m
    if api == "anthropic" then
        m = max_tokens
    else
        m = max_completion_tokens or max_tokens or max_output_tokens
    end
    local cap = s and s.max_tokens_cap or 4096
    if not m or m < 1 then
        m = s and s.default_max_tokens or 256
    else
        m = math_min(math_floor(m), cap)
    end
    n = (n and n >= 1) and math_floor(n) or 1
    if prompts > 1 then
        n = n * prompts
    end
    return m * math_min(n, s and s.max_choices or 1)
end

-- The output reservation of a body, or nil, err when nginx cannot decode it (the engine
-- may: it is refused, never reserved at a default). Read by plugins/limits/body_fields in one
-- pass over the bytes; a body it cannot read as cjson would is decoded. Read again for the
-- same bytes (an L1 hit): a per-worker memo keyed by the body string cost more than it
-- saved (bench/engine_stages.md), as LuaJIT hashes a long string from a few of its bytes
-- and same-length bodies that agree there share one hash chain.
local function output_reservation(body, api)
    if not body then
        local s = settings.get().limits
        return s and s.default_max_tokens or 256
    end
    local ok, v1, v2, v3, v4, prompts = body_fields.read(body)
    if ok then
        return budget(api, v1, v2, v3, v4, prompts)
    end
    local doc, err = cjson.decode(body)
    if type(doc) ~= "table" then
        return nil, err or "not a JSON object"
    end
    return budget(api, body_fields.of_doc(doc))
end

local MAX_ROUNDS = 3   -- lease rounds (a grant may be spent by this worker's other requests meanwhile)

-- Whether this worker's leases cover `needs` with no Redis round trip (a concurrency limit:
-- a spare slot of this worker's, zccp.plugins.limits.lease).
local function covered(w, needs)
    local keys = w.keys
    if w.exact and needs[CONC] > 0 then
        local conc = w.conc
        for c = 1, #conc do
            if not lease.conc_free(keys[conc[c]]) then
                return false
            end
        end
    end
    local act, act_j = w.act, w.act_j
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
                    if ask and lease.conc_free(keys[i]) then   -- a spare slot: no Redis for it
                        lease.conc_take(keys[i], now)
                        local counted = ticket.conc or {}
                        counted[#counted + 1] = keys[i]
                        ticket.conc = counted
                        ask = false
                    end
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
        local tag = w.tenant_tag
        local rec = lease.record(tag)
        for n = 1, #ak do
            if ax[n] then
                lease.conc_sent(ak[n], tag)
            end
        end
        local ok, k, c = lease.acquire(t, ak, al, aw, ax, att, ae, tag, now, rec)
        for n = 1, #ak do
            if ax[n] then
                lease.conc_replied(ak[n], ok, now, ok and tonumber(k[2 * n]) or 1)
                if ok then
                    local counted = ticket.conc or {}
                    counted[#counted + 1] = ak[n]
                    ticket.conc = counted
                end
            end
        end
        if not ok then
            if ok == false then
                return false, at[k], c
            end
            -- no reply: it may have happened; the flush gives its windowed grants back
            -- (UNDO), and this worker's next write its in-flight counts
            local leased = {}
            for n = 1, #ak do
                if not ax[n] then
                    leased[#leased + 1] = ak[n]
                end
            end
            ticket.undo, ticket.undo_keys = rec, leased
            return nil, k
        end
    end
    return false, nil, 0
end

-- The concurrency slots of an admission that covered() passed: this worker's spare ones.
local function take_spare(w, ticket, now)
    local keys, conc = w.keys, w.conc
    local counted = ticket.conc or {}
    for c = 1, #conc do
        local ck = keys[conc[c]]
        lease.conc_take(ck, now)
        counted[#counted + 1] = ck
    end
    ticket.conc = counted
end

_M.take_spare = take_spare
_M.output = output_reservation
_M.covered = covered
_M.take = reserve
return _M
