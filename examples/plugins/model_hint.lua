-- x-model-hint: NAME picks the model (the replica set of engines: serving NAME), as
-- seed 001's routing header did. An unknown NAME is the client's 400, naming the header.
local engines = require "zccp.lib.engines"
local pipeline = require "zccp.core.pipeline"

local ngx_var = ngx.var
local ipairs = ipairs

local _M = {
    name = "model_hint",
    after = { "router" },   -- it overrides what the body's model chose
    schema = {
        variable = { type = "string", default = "http_x_model_hint" },   -- the nginx variable read
    },
}

local models   -- the models engines: serve, built on the first request (engines is set by then)

function _M.route(r, conf)
    local hint = ngx_var[conf.variable]
    if not hint or not r.multi then
        return
    end
    if not models then
        models = {}
        for _, e in ipairs(engines.list()) do
            if e.model then   -- one engine without engines: serves whatever is named
                models[e.model] = true
            end
        end
    end
    if not models[hint] then
        return pipeline.refuse(r, 400, "invalid_request_error",
            "x-model-hint: no engine serves model " .. hint)
    end
    r.model = hint
end

return _M
