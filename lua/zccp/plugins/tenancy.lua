-- The tenant (zccp.lib.tenant, cache.tenant_source): its digest goes into the slot.
local abi = require "zccp.lib.abi"
local tenant = require "zccp.lib.tenant"

local _M = { name = "tenancy" }

-- The OpenAI endpoints beside chat completions (request.openai_api).
local OPENAI_ENDPOINTS = { completions = "ZCCP_OPENAI_COMPLETIONS", responses = "ZCCP_OPENAI_RESPONSES" }

function _M.prepare(r)
    if r.kind then
        return
    end
    if r.endpoint then   -- the engine fingerprints these itself, under keys naming the endpoint
        r.extra = { tenant = tenant.digest(nil, r.who), openai_api = abi.C[OPENAI_ENDPOINTS[r.endpoint]] }
        return
    end
    local t = tenant.digest(r.fp, r.who)
    r.tenant, r.extra = t, t and { tenant = t }
end

return _M
