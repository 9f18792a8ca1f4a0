-- Response headers set with one FFI call each: the limits plugin's rate-limit headers (6 or 12 on
-- every answer with limits). ngx.header's assignment goes through a metamethod, resty.core's
-- checks, a request lookup and a tostring for each header; most of a request's Lua runs in
-- LuaJIT's interpreter, where those steps cost about as much again as the C call itself
-- (bench/keys.md, attribution). This calls the C function resty.core.response calls, with
-- the request looked up once; where that function is not the one declared (macOS) or it
-- fails, ngx.header does the work (and raises what it raises).
--
--   local r = resp_header.request()
--   resp_header.put(r, "x-ratelimit-limit-requests", "60")   -- name without '_'; value a string
local ffi = require "ffi"
local base = require "resty.core.base"
require "resty.core.response"   -- declares ngx_http_lua_ffi_set_resp_header

local C = ffi.C
local get_request = base.get_request
local errmsg = base.get_errmsg_ptr()
local FFI_DECLINED = base.FFI_DECLINED
local pcall = pcall
local ngx = ngx

local _M = { _VERSION = "0.1.0" }

local direct = jit.os ~= "OSX" and pcall(function() return C.ngx_http_lua_ffi_set_resp_header end)

-- The current request for put(), or nil (put() then uses ngx.header).
function _M.request()
    return direct and get_request() or nil
end

local proven = false   -- the first call runs under pcall: a lua-resty-core whose declaration
                       -- differs from this call's arguments turns the direct path off

local function set(r, name, value)
    return C.ngx_http_lua_ffi_set_resp_header(r, name, #name, false, value, #value, nil, 0, 1, errmsg)
end

function _M.put(r, name, value)
    if r then
        local rc
        if proven then   -- the call inline: one Lua call less per header (most runs interpreted)
            rc = C.ngx_http_lua_ffi_set_resp_header(r, name, #name, false, value, #value, nil, 0, 1, errmsg)
        else
            local ok, res = pcall(set, r, name, value)
            if ok then
                proven, rc = true, res
            else
                direct = false
                ngx.log(ngx.WARN, "zccp: headers through ngx.header: ", res)
            end
        end
        if rc == 0 or rc == FFI_DECLINED then
            return
        end
    end
    ngx.header[name] = value
end

return _M
