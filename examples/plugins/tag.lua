-- Tags each request's usage record with the caller's x-team header ("team": ... in the
-- usage line; requests with an API key and auth.usage_log set). Settings: field (the
-- record's key, default "team"), header (the nginx variable, default http_x_team).
-- Put it after "limits" in plugins.chain: the usage record exists once limits admitted.
local usage = require "zccp.plugins.usage"

local ngx_var = ngx.var

local _M = { name = "tag" }

function _M.prepare(_, conf)
    local v = ngx_var[conf.header or "http_x_team"]
    if v then
        usage._field(conf.field or "team", v)
    end
end

return _M
