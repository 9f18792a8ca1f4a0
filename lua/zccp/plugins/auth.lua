-- API keys (zccp.plugins.auth.keys): the key before the body (401), its models once the body is read (404).
local auth = require "zccp.plugins.auth.keys"
local DONE = require("zccp.core.pipeline").DONE
local model_id = require("zccp.core.edges").model_id

local ngx = ngx

local _M = { name = "auth", before = { "limits" } }

-- GET /v1/models answers with the key's models only (zccp.core.attempts asks this hook).
_M._provides = { models_body = auth.models_body }

-- auth.mode off: not in the chain at all (r.who stays nil; limits are off with it).
function _M._active()
    return require("zccp.settings").keys_on()
end

function _M.access(r)
    if r.admin then   -- the admin listener's token was checked by the core (zccp.admin.gate)
        r.who = auth.OFF
        return
    end
    local who = auth.admit(r.api)
    if not who then
        return DONE
    end
    r.who = who
end

function _M.wants_body(r)
    return auth.wants_body(r.who)
end

function _M.prepare(r)
    if r.kind == "models" then   -- the list is filtered (auth.models_body); one model is checked
        if not auth.allow_model_id(r.who, r.api, model_id(ngx.var.uri)) then
            return DONE
        end
    elseif not auth.allow_model(r.who, r.api, r.body) then
        return DONE
    end
end

return _M
