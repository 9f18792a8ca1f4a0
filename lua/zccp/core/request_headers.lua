-- What the request's own headers tell the core: whether its Content-Type is JSON, and the
-- slot's cache flags (Cache-Control: no-cache / no-store, X-ZCCP-Cache-Sampled). Read once
-- per request, before the body (zccp.handler).
--
--   local rh = require "zccp.core.request_headers"
--   if not rh.is_json(ngx.var.content_type) then ... end
--   local flags = rh.cache_flags()      -- ZCCP_FLAG_* bits (zccp_abi.h)
local abi = require "zccp.lib.abi"

local ngx_var = ngx.var
local str_find = string.find
local str_lower = string.lower

local _M = { _VERSION = "0.1.0" }

function _M.is_json(ct)
    if ct == "application/json" then   -- what nearly every client sends: no pattern, no copy
        return true
    end
    ct = str_lower(ct)   -- media types are case-insensitive
    return str_find(ct, "^%s*application/json") or str_find(ct, "^%s*application/[%w.-]+%+json")
end

-- X-ZCCP-Cache-Sampled: on | off, the request's override of cache.sampled (docs/cache.md)
local function sampled_flag(C)
    local v = ngx_var.http_x_zccp_cache_sampled
    if not v then
        return 0
    end
    v = str_lower(v)
    if str_find(v, "^%s*on%s*$") then
        return C.ZCCP_FLAG_SAMPLED_ON
    elseif str_find(v, "^%s*off%s*$") then
        return C.ZCCP_FLAG_SAMPLED_OFF
    end
    return 0
end

function _M.cache_flags()
    local C = abi.C
    local cc = ngx_var.http_cache_control
    local f = sampled_flag(C)
    if not cc then
        return f
    end
    if str_find(cc, "no-cache", 1, true) then
        f = f + C.ZCCP_FLAG_NO_CACHE
    end
    if str_find(cc, "no-store", 1, true) then
        f = f + C.ZCCP_FLAG_NO_STORE
    end
    return f
end

return _M
