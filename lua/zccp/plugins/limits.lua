-- Admission limits and leases (plugins/limits/: admit, lease, windows, reserve, flush, the
-- usage log): admit with the body (429, with its rate-limit headers; an admitted request's
-- are plugins/ratelimit_headers'), the engine's exact counts after the relay, settled in
-- log. The request's record is r.limits.
local limits = require "zccp.plugins.limits.admit"
local DONE = require("zccp.core.pipeline").DONE

local _M = { name = "limits" }

-- Limits need a key (r.who): off with auth.mode off, and then not in the chain at all.
function _M._active()
    return require("zccp.settings").keys_on()
end

-- A key with limits has its body read whole (max_tokens is reserved).
function _M.wants_body(r)
    local who = r.who
    return who ~= nil and limits.limited(who)
end

function _M.prepare(r)
    if not r.who then   -- a chain without auth: no key, nothing to limit
        return
    end
    local ok, ticket = limits.admit(r)
    if not ok then
        return DONE
    end
    r.admitted = ticket   -- nil when no limit reserved anything (no rate-limit headers)
end

function _M.relayed(r, _, meta, outcome, res)
    limits.observe(r, meta, r.cache, outcome, res)   -- settles on what was sent, whatever the ending
end

function _M.log(r)
    limits.settle(r)
end

return _M
