-- The engine's committed mark (zccp_abi.h meta.committed_mark): one 64-bit word, written
-- after the response bytes it names, so nginx reads a byte count and the output tokens
-- whose bytes lie below it together (never a count ahead of its bytes).
--
--   local at, tokens = mark.read(meta)   -- 0, 0 before the engine's first write
local tonumber = tonumber

local _M = { _VERSION = "0.1.0" }

local SHIFT = 4294967296ULL

function _M.read(meta)
    local m = meta.committed_mark   -- one aligned load
    return tonumber(m / SHIFT), tonumber(m % SHIFT)
end

return _M
