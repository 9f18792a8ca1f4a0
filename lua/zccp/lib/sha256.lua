-- SHA-256 over memory ranges through libcrypto (C speed, no Lua string needed), and
-- the same library's random bytes (response ids: zccp.plugins.l1.cache).
local ffi = require "ffi"

local pcall = pcall
local ffi_string = ffi.string
local ffi_cast = ffi.cast
local str_format = string.format
local concat = table.concat
local type = type

local _M = { _VERSION = "0.2.0" }

ffi.cdef [[
int SHA256_Init(void *c);
int SHA256_Update(void *c, const void *data, size_t len);
int SHA256_Final(unsigned char *md, void *c);
int RAND_bytes(unsigned char *buf, int num);
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
-- SHA256_CTX is 112 bytes in every OpenSSL; the room here does not depend on its layout.
local ctx = ffi.new("uint8_t[256]")

local HEX = {}   -- byte -> two hex digits, made once
for b = 0, 255 do
    HEX[b] = str_format("%02x", b)
end
local u8p = ffi.typeof("const uint8_t *")

-- Lowercase hex of `n` bytes at `p` (a pointer or a Lua string): digests, context ids.
function _M.hex(p, n)
    if type(p) == "string" then
        p = ffi_cast(u8p, p)
    end
    local t = {}
    for k = 0, n - 1 do
        t[k + 1] = HEX[p[k]]
    end
    local hex = concat(t)
    return hex
end

-- Digest of `len` bytes at `ptr` (a pointer or a Lua string) into `out` (32 bytes).
-- Init/Update/Final on the worker's context, not the one-shot SHA256(): OpenSSL 3's one-shot
-- fetches the digest through EVP on every call (slower; every L1 lookup and every cached
-- miss would pay it: bench/jit_paths.md). Never yields.
function _M.digest_into(ptr, len, out)
    if not crypto then
        return nil, "libcrypto not found"
    end
    crypto.SHA256_Init(ctx)
    crypto.SHA256_Update(ctx, ptr, len)
    crypto.SHA256_Final(out, ctx)
    return out
end

-- Digest as a 32-byte Lua string.
function _M.digest(ptr, len)
    local ok, err = _M.digest_into(ptr, len, md)
    if not ok then
        return nil, err
    end
    local d = ffi_string(md, 32)
    return d
end

-- Digest of the concatenation of up to three ranges (a pointer or a Lua string, and a
-- length; a range may be nil), as a 32-byte Lua string: one pass over each range,
-- nothing copied. Never yields (one context per worker).
function _M.digest_parts(p1, n1, p2, n2, p3, n3)
    if not crypto then
        return nil, "libcrypto not found"
    end
    crypto.SHA256_Init(ctx)
    if p1 and n1 > 0 then crypto.SHA256_Update(ctx, p1, n1) end
    if p2 and n2 > 0 then crypto.SHA256_Update(ctx, p2, n2) end
    if p3 and n3 > 0 then crypto.SHA256_Update(ctx, p3, n3) end
    crypto.SHA256_Final(md, ctx)
    local d = ffi_string(md, 32)
    return d
end

-- Digest of `head` (a Lua string) then the spans of `base` (a pointer) that `spans` lists
-- as offset, length pairs (spans[1], spans[2], ...; n numbers), as a 32-byte Lua string:
-- nothing copied, never yields (zccp.fp.fingerprint's route key).
function _M.digest_spans(head, base, spans, n)
    if not crypto then
        return nil, "libcrypto not found"
    end
    crypto.SHA256_Init(ctx)
    crypto.SHA256_Update(ctx, head, #head)
    for k = 1, n, 2 do
        local len = spans[k + 1]
        if len > 0 then
            crypto.SHA256_Update(ctx, base + spans[k], len)
        end
    end
    crypto.SHA256_Final(md, ctx)
    local d = ffi_string(md, 32)
    return d
end

-- `n` random bytes from libcrypto's CSPRNG (the library loaded here) into `out`: true, or nil, err.
function _M.random_into(out, n)
    if not crypto then
        return nil, "libcrypto not found"
    end
    if crypto.RAND_bytes(out, n) ~= 1 then
        return nil, "RAND_bytes failed"
    end
    return true
end

return _M
