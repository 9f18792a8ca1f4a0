-- The request's tenant for the cache (cache.tenant_source): SHA-256 of the source's
-- value, written into request.tenant with ZCCP_FLAG_TENANT. Header sources are known
-- only here; the body's end user when nginx decoded the body (else the engine reads it).
--
--   local tenant = require "zccp.lib.tenant"
--   local digest = tenant.digest(fp, r.who)   -- 32-byte string, or nil (anonymous / left to the engine)
local settings = require "zccp.settings"
local sha256 = require "zccp.lib.sha256"

local ngx_var = ngx.var
local str_match = string.match
local str_lower = string.lower
local str_gsub = string.gsub
local str_find = string.find
local str_byte = string.byte
local str_sub = string.sub

local _M = { _VERSION = "0.1.0" }

local header_var   -- ngx.var name of cache.tenant_header ("http_x_tenant_id")

local function source_value(s, fp)
    local src = s.tenant_source
    if src == "api_key" then
        return _M.api_key()
    end
    if src == "header" then
        if not header_var then
            header_var = "http_" .. str_gsub(str_lower(s.tenant_header), "-", "_")
        end
        return ngx_var[header_var]
    end
    return fp and fp.end_user   -- "user": metadata.user_id / user, when nginx decoded the body
end

-- Whether byte b is what %s matches (space, \t, \n, \v, \f, \r).
local function is_space(b)
    return b == 32 or (b >= 9 and b <= 13)
end

-- The caller's API key: x-api-key (Anthropic's), else the token of Authorization: Bearer
-- (OpenAI's). A header that is present but empty (or blank) is no key: it falls through.
-- The usual header (no surrounding blanks) is returned as it is: no pattern match, which
-- LuaJIT does not compile, on every request.
function _M.api_key()
    local key = ngx_var.http_x_api_key
    if key then
        local n = #key
        if n > 0 and not is_space(str_byte(key, 1)) and not is_space(str_byte(key, n)) then
            return key
        end
        if str_find(key, "%S") then
            local trimmed = str_match(key, "^%s*(.-)%s*$")
            return trimmed
        end
    end
    local auth = ngx_var.http_authorization
    if not auth then
        return nil
    end
    -- "Bearer <token>" (the usual form): the token, when it holds no blank
    if str_sub(auth, 1, 7) == "Bearer " and #auth > 7 and not str_find(auth, "[%s]", 8) then
        local token = str_sub(auth, 8)
        return token
    end
    local token = str_match(auth, "^[Bb][Ee][Aa][Rr][Ee][Rr]%s+(%S+)%s*$")
    return token
end

-- fp: the request's fingerprint (zccp.fp.fingerprint.compute), or nil. With keys on
-- (the auth plugin) the tenant is the verified key's, whatever cache.tenant_source says.
-- who: the request's caller (r.who, set by the auth plugin), or nil.
function _M.digest(fp, who)
    local verified = who and settings.keys_on() and who.tenant_digest
    if verified then
        return verified
    end
    local v = source_value(settings.get(), fp)
    if not v or v == "" then
        return nil
    end
    return sha256.digest(v, #v)
end

return _M
