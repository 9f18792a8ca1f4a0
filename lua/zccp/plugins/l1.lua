-- nginx's L1 (zccp.plugins.l1.cache): the very same bytes before any fingerprint (prepare), the same
-- request after its keys (keys), a streamed body's once it is in the slot (filled); the
-- engine's answer kept (relayed). A hit is answered here and ends the chain.
local l1 = require "zccp.plugins.l1.cache"
local l1_spans = require "zccp.plugins.l1.spans"
local attempts = require "zccp.core.attempts"
local DONE = require("zccp.core.pipeline").DONE

local ngx_log = ngx.log
local ngx_ERR = ngx.ERR
local pcall = pcall

-- After the plugins that may refuse or set headers on an admitted request (a hit answers
-- in prepare: nothing after l1 runs in prepare then).
local _M = { name = "l1", after = { "auth", "limits", "ratelimit_headers" } }

-- A hit: its counts for the plugins that meter (r.served), and the chain ends.
local function hit(r, k)
    r.served = { input = k.hit_in, output = k.hit_out, cache = "HIT" }
    return DONE
end

-- POST /v1/zccp/l1/purge (zccp.core.edges) empties L1 through this hook.
_M._provides = { purge_l1 = l1.purge }

-- An L1 answer, written: true, and its span when the engine traces (zccp.plugins.l1.spans).
local function served(api, k, final)
    if l1.serve(api, k, final) then
        l1_spans.note(api)
        return true
    end
    return false
end

function _M.prepare(r)
    if r.kind == "purge" then
        l1.purge()   -- before the engine purges Redis, and again after (zccp.core.attempts)
    end
    if r.kind or r.endpoint then   -- /v1/completions, /v1/responses: keys name the API, not the endpoint
        return
    end
    local k = l1.begin(r.api, r.body, r.flags, r.who)
    if k and not k.pending and served(r.api, k) then
        return hit(r, k)
    end
    r.l1 = k
end

function _M.keys(r)
    local k = r.l1
    if not k then
        return
    end
    l1.exact(k, r.fp, r.tenant)
    if not k.pending and served(r.api, k, true) then
        return hit(r, k)
    end
    local state = r.state
    state.l1, state.keep = k, l1.max_entry(k)
    r.src.digest = k.digest
end

function _M.filled(r, _, slot)
    local k = r.state.l1
    if k and k.pending then   -- a streamed body: L1 by the digest of the bytes now in the slot
        l1.digested(k, attempts.slot_digest(slot))
        if served(r.api, k, true) then
            return hit(r, k)
        end
    end
end

function _M.relayed(r, _, meta, outcome, res)
    if r.kind == "purge" then
        l1.purge()   -- what was relayed from Redis while the engine purged it is gone too
        return
    end
    local k = r.state.l1
    if outcome == "done" and k then
        local kept, kerr = pcall(l1.keep, r.api, k, meta, res)
        if not kept then
            ngx_log(ngx_ERR, "zccp: L1 store failed: ", kerr)
        end
    end
end

return _M
