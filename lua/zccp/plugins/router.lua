-- Several engines (zccp.plugins.router.route, zccp.lib.engines): the body picks the model or the replica
-- (route); the answer names the engine that took it (headers).
local engines = require "zccp.lib.engines"
local router = require "zccp.plugins.router.route"
local fingerprint = require "zccp.fp.fingerprint"

local ngx_header = ngx.header

local _M = { name = "router" }

-- What the core asks without naming a plugin (zccp.core.attempts): the engines in rank
-- order, and one that failed.
_M._provides = { order = router.order, engine_down = router.down }

-- One engine: nothing to route (r.multi stays nil) and no X-ZCCP-Engine: not in the chain.
function _M._active()
    return engines.multi()
end

function _M.wants_body()
    return router.needs_body()
end

function _M.route(r)
    if not engines.multi() then
        return
    end
    r.multi = true
    local kind, body = r.kind, r.body
    local wfp = kind == "warmup" and body and fingerprint.keys(r.api, body)
    if wfp then   -- warm the replica the conversation's turns will go to
        r.route_key = wfp.route_key
    end
    r.model = wfp and wfp.model or kind ~= "models" and kind ~= "purge" and router.model_of(r, body) or nil
end

function _M.headers(r, _, e)
    if r.multi then
        ngx_header["X-ZCCP-Engine"] = e.name
    end
end

return _M
