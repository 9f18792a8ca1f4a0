-- Cache keys and masks (zccp.fp.fingerprint, zccp.fp.mask_store): bounded work, for a generation
-- whose body nginx read and whose cache is not bypassed (no-cache + no-store).
local bit = require "bit"
local abi = require "zccp.lib.abi"
local fingerprint = require "zccp.fp.fingerprint"

local band = bit.band

local _M = { name = "fingerprint" }

function _M.prepare(r)
    local body = r.body
    if r.kind or r.endpoint or not body then   -- a streamed body is the engine's to fingerprint
        return
    end
    local bypass = abi.C.ZCCP_FLAG_NO_CACHE + abi.C.ZCCP_FLAG_NO_STORE
    if band(r.flags, bypass) ~= bypass then
        r.fp = fingerprint.keys(r.api, body)
    end
end

function _M.keys(r)
    if r.fp then
        fingerprint.complete(r.fp)   -- the near-duplicate part: only the engine needs it
    end
end

return _M
