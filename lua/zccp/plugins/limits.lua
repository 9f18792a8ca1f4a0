-- Admission limits and leases (zccp.plugins.limits.admit, zccp.plugins.limits.lease): admit with the body (429, with its
-- rate-limit headers; an admitted request's are plugins/ratelimit_headers'), the engine's
-- exact counts after the relay, settled in log.
local limits = require "zccp.plugins.limits.admit"
local DONE = require("zccp.core.pipeline").DONE

local _M = { name = "limits" }

-- Limits need a key (r.who): off with auth.mode off, and then not in the chain at all.
function _M._active()
    return require("zccp.settings").keys_on()
end

function _M.prepare(r)
    if not r.who then   -- a chain without auth: no key, nothing to limit
        return
    end
    local ok, ticket = limits.admit(r.who, r.api, r.body, r.kind, r.request_id)
    if not ok then
        return DONE
    end
    r.admitted = ticket   -- nil when no limit reserved anything (no rate-limit headers)
end

function _M.relayed(r, _, meta, outcome, res)
    limits.observe(meta, r.cache, outcome, res)   -- settles on what was sent, whatever the ending
end

function _M.log()
    limits.settle()
end

return _M
