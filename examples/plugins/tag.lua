-- Tags each request's usage record with the caller's x-team header ("team": ... in the
-- usage line; requests with an API key and auth.usage_log set). A header's bytes are
-- written as valid UTF-8; a field named like one of the line's own is refused.
local usage_fields = require "zccp.lib.usage_fields"

local ngx_var = ngx.var

local _M = {
    name = "tag",
    after = { "limits" },   -- the usage record exists once limits admitted
    schema = {
        field = { type = "string", default = "team" },           -- the record's key
        header = { type = "string", default = "http_x_team" },   -- the nginx variable read
    },
}

function _M.prepare(r, conf)
    local v = ngx_var[conf.header]
    if v then
        local ok, err = usage_fields.add(r, conf.field, v)
        if not ok and err ~= "no usage record for this request" then
            ngx.log(ngx.WARN, "tag: ", err)
        end
    end
end

return _M
