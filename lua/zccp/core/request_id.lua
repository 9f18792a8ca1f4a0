-- The request id nginx makes for a caller that sent none (or none it can keep): 32 hex
-- digits of libcrypto's CSPRNG, as nginx's $request_id, cut from a hex string of POOL_IDS
-- ids drawn in one call. $request_id calls RAND_bytes once per request (its cost on an L1
-- hit: bench/jit_paths.md); here a request pays one substring. The pool is
-- drawn in the worker, at its first id: never copied from the master into several workers.
--
--   local id = request_id.new()
local ffi = require "ffi"
local sha256 = require "zccp.lib.sha256"

local ngx = ngx
local str_sub = string.sub

local _M = { _VERSION = "0.1.0" }

local POOL_IDS = 128
local BYTES = 16                      -- 128 bits, as $request_id
local buf = ffi.new("uint8_t[?]", POOL_IDS * BYTES)
local hex, at = nil, POOL_IDS         -- the pool's hex digits; the next id's index in it

function _M.new()
    if at >= POOL_IDS then
        if not sha256.random_into(buf, POOL_IDS * BYTES) then
            return ngx.var.request_id   -- nginx's own (one RAND_bytes of its own)
        end
        hex, at = sha256.hex(buf, POOL_IDS * BYTES), 0
    end
    local i = at * 2 * BYTES
    at = at + 1
    local id = str_sub(hex, i + 1, i + 2 * BYTES)
    return id
end

return _M
