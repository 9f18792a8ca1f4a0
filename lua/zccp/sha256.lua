-- SHA-256 over a memory range through libcrypto (C speed, no Lua string needed).
local ffi = require "ffi"

local pcall = pcall
local ffi_string = ffi.string

local _M = { _VERSION = "0.1.0" }

ffi.cdef [[
unsigned char *SHA256(const unsigned char *d, size_t n, unsigned char *md);
]]

local function load_crypto()
    for _, name in ipairs { "crypto", "libcrypto.so.3", "libcrypto.so.1.1" } do
        local ok, lib = pcall(ffi.load, name)
        if ok then
            return lib
        end
    end
    return nil
end

local crypto = load_crypto()
local md = ffi.new("unsigned char[32]")

-- Digest of `len` bytes at `ptr` (a pointer or a Lua string) into `out` (32 bytes).
function _M.digest_into(ptr, len, out)
    if not crypto then
        return nil, "libcrypto not found"
    end
    crypto.SHA256(ptr, len, out)
    return out
end

-- Digest as a 32-byte Lua string.
function _M.digest(ptr, len)
    local ok, err = _M.digest_into(ptr, len, md)
    if not ok then
        return nil, err
    end
    return ffi_string(md, 32)
end

return _M
