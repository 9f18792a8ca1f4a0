-- Usage records (zccp.usage_log, written by zccp.limits.settle): plugins add their own
-- fields to this request's line with _M.field (docs/plugins.md).
local cjson = require "cjson.safe"

local ngx = ngx
local encode = cjson.encode

local _M = { name = "usage" }

-- Adds "key":value to this request's usage line (a request with an API key, auth.usage_log
-- set). Returns true, or nil, why. Call it in access, prepare or later (after limits).
function _M._field(key, value)
    local t = ngx.ctx.zccp_limits
    if not t then
        return nil, "no usage record for this request"
    end
    t.fields = (t.fields or "") .. "," .. encode(key) .. ":" .. encode(value)
    return true
end

return _M
