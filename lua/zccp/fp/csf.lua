-- The content-similarity fingerprint (docs/fingerprint.md §4-§5): tokens, word
-- 2-shingles, the one-permutation MinHash signature, LSH band keys and csf_key, read
-- straight from memory (a pointer and a length: no Lua string of the text is needed).
-- engine/zccp/cache/fp/csf.py is the same algorithm in Python, byte for byte.
--
--   local csf = require "zccp.fp.csf"
--   local sig, ntok, complete = csf.signature(ptr, len)   -- uint32_t[NUM_PERM], tokens, all seen?
--   local csf_key, bands = csf.keys_of(sig)                -- uint64_t, { BANDS x uint64_t }
local ffi = require "ffi"
local bit = require "bit"
local T = require "zccp.fp.tables"
local abi = require("zccp.lib.abi").init()

local error = error
local tostring = tostring
local ipairs = ipairs
local ffi_new = ffi.new
local ffi_cast = ffi.cast
local ffi_fill = ffi.fill
local band, bxor, lshift, rshift, tobit = bit.band, bit.bxor, bit.lshift, bit.rshift, bit.tobit

local _M = { _VERSION = "0.2.0" }

local MAX_TOKENS = T.max_tokens
local NUM_PERM = abi.C.ZCCP_MINHASH_COUNT   -- the slot holds the signature and the bands
local BANDS = abi.C.ZCCP_CSF_BANDS
local ROWS = NUM_PERM / BANDS

_M.MAX_TOKENS = MAX_TOKENS
_M.NUM_PERM = NUM_PERM

local u64 = ffi.typeof("uint64_t")
local u64_arr = ffi.typeof("uint64_t[?]")
local u32_arr = ffi.typeof("uint32_t[?]")
local M32 = 0xFFFFFFFFULL
local FNV64_OFFSET = 0xCBF29CE484222325ULL
local FNV64_PRIME = 0x100000001B3ULL

-- ------------------------------------------------------------------ one-permutation MinHash

-- Each shingle hash x is mixed once (splitmix64's output function of x xor SEED): the top
-- BIN_BITS bits pick its bin, the low 32 bits are its value; a bin keeps its minimum.
-- Empty bins are filled by optimal densification: bin i copies the first bin of
-- PROBE[i] (a fixed permutation of the bins) that a shingle filled.
local SEED = u64(T.seed_hi) * 0x100000000ULL + u64(T.seed_lo)
local MIX1 = 0xBF58476D1CE4E5B9ULL
local MIX2 = 0x94D049BB133111EBULL
local BIN_BITS = 0
while 2 ^ BIN_BITS < NUM_PERM do
    BIN_BITS = BIN_BITS + 1
end
assert(2 ^ BIN_BITS == NUM_PERM and NUM_PERM <= 256, "ZCCP_MINHASH_COUNT must be a power of two <= 256")
local BIN_SHIFT = 64 - BIN_BITS

local PROBE = ffi_new("uint8_t[?]", NUM_PERM * NUM_PERM)   -- row i: bin i's probe order
do
    local state = SEED
    local function splitmix64()
        state = state + 0x9E3779B97F4A7C15ULL
        local z = state
        z = bxor(z, rshift(z, 30)) * MIX1
        z = bxor(z, rshift(z, 27)) * MIX2
        local z2 = bxor(z, rshift(z, 31))
        return z2
    end
    for i = 0, NUM_PERM - 1 do
        local row = i * NUM_PERM
        for j = 0, NUM_PERM - 1 do
            PROBE[row + j] = j
        end
        for j = NUM_PERM - 1, 1, -1 do   -- Fisher-Yates
            local r = row + tonumber(splitmix64() % (j + 1))
            PROBE[row + j], PROBE[r] = PROBE[r], PROBE[row + j]
        end
    end
end

-- ------------------------------------------------------------------ code point classes

-- A code point's class (0: word, 1: separator, 2: CJK, a token of its own) is read from
-- two tables, without a loop (a loop here would keep LuaJIT from compiling the scan
-- below as one trace): PAGE[cp >> 8] is the class of a whole 256-code-point page, or
-- 3 + k when the page is mixed and its classes are MIXED[k * 256 .. k * 256 + 255].
local NPAGES = 0x110000 / 256
local PAGE = ffi_new("uint8_t[?]", NPAGES)
local MIXED
do
    local CLASS = { S = 1, C = 2 }
    local pages = {}   -- page -> { [cp & 255] = class } for pages a range covers in part
    for _, r in ipairs(T.ranges) do
        local cl = CLASS[r[3]]
        if not cl then
            error("zccp.fp.tables: unknown class " .. tostring(r[3]))
        end
        for pg = rshift(r[1], 8), rshift(r[2], 8) do
            local lo, hi = math.max(r[1], pg * 256), math.min(r[2], pg * 256 + 255)
            if hi - lo == 255 then
                PAGE[pg] = cl       -- the whole page (ranges never overlap)
            else
                pages[pg] = pages[pg] or {}
                for cp = lo, hi do
                    pages[pg][cp - pg * 256] = cl
                end
            end
        end
    end
    local order = {}
    for pg in pairs(pages) do
        order[#order + 1] = pg
    end
    table.sort(order)
    assert(#order <= 252, "zccp.fp.tables: too many mixed pages")
    MIXED = ffi_new("uint8_t[?]", math.max(1, #order) * 256)
    for k, pg in ipairs(order) do
        PAGE[pg] = 3 + (k - 1)
        for lo = 0, 255 do
            MIXED[(k - 1) * 256 + lo] = pages[pg][lo] or 0
        end
    end
end

local function cp_class(cp)
    local pg = PAGE[rshift(cp, 8)]
    if pg < 3 then
        return pg
    end
    return MIXED[(pg - 3) * 256 + band(cp, 255)]
end

-- The text is not lowercased as a whole: ASCII_WORD takes [0-9A-Za-z] as word bytes
-- and the hashes read bytes through LOWER (A-Z -> a-z, every other byte unchanged).
local ASCII_WORD = ffi_new("uint8_t[128]")
for c = 48, 57 do ASCII_WORD[c] = 1 end
for c = 65, 90 do ASCII_WORD[c] = 1 end
for c = 97, 122 do ASCII_WORD[c] = 1 end
local LOWER = ffi_new("uint8_t[256]")
for c = 0, 255 do LOWER[c] = (c >= 65 and c <= 90) and c + 32 or c end

-- ------------------------------------------------------------------ CSF

local X = u64_arr(MAX_TOKENS + 1)  -- the shingle hashes of one scan
local u8p = ffi.typeof("const uint8_t *")

local FNV32_OFFSET = tobit(0x811C9DC5)

-- One byte into both running FNV-1a 32 hashes: the token's (hc) and the shingle's (hs).
-- (* 0x01000193 mod 2^32 as lshift(h, 24) + h * 403: exact in doubles, then tobit.)
local function fnv2(hc, hs, b)
    hc = bxor(hc, b)
    hs = bxor(hs, b)
    return tobit(lshift(hc, 24) + hc * 403), tobit(lshift(hs, 24) + hs * 403)
end

-- A token ends: the shingle it closes with the previous token (hs) goes to X[nx], once
-- there is a previous token. Returns the next free index.
local function token_end(nx, hs, ntok)
    if ntok > 1 then
        X[nx] = hs % 4294967296
        return nx + 1
    end
    return nx
end

-- Tokenizes p[0 .. n-1] and hashes the shingles in the same pass: each token's FNV-1a 32
-- (hc) and, from the previous token's hash followed by 0x20, the shingle's (hs) are
-- carried along byte by byte (bytes lowercased through LOWER). Returns the number of
-- tokens kept, whether that was all of them, and the number of shingle hashes written
-- to X (repeats included: a bin keeps a minimum, so they change nothing).
local function scan(p, n)
    local ntok, nx = 0, 0
    local limit = MAX_TOKENS
    local inword = false
    local hc, hs, prev = 0, 0, 0
    local i = 0
    while i < n do
        local c = p[i]
        local len, cls = 1, 0
        if c < 0x80 then
            if ASCII_WORD[c] == 0 then
                cls = 1
            end
        else
            -- decode one well-formed UTF-8 sequence (Unicode Table 3-7), else 1 invalid byte
            local cp = -1
            if c >= 0xC2 and c <= 0xDF then
                if i + 1 < n then
                    local c1 = p[i + 1]
                    if c1 >= 0x80 and c1 <= 0xBF then
                        len, cp = 2, (c - 0xC0) * 64 + (c1 - 0x80)
                    end
                end
            elseif c >= 0xE0 and c <= 0xEF then
                if i + 2 < n then
                    local c1, c2 = p[i + 1], p[i + 2]
                    local lo1, hi1 = 0x80, 0xBF
                    if c == 0xE0 then lo1 = 0xA0 elseif c == 0xED then hi1 = 0x9F end
                    if c1 >= lo1 and c1 <= hi1 and c2 >= 0x80 and c2 <= 0xBF then
                        len, cp = 3, (c - 0xE0) * 4096 + (c1 - 0x80) * 64 + (c2 - 0x80)
                    end
                end
            elseif c >= 0xF0 and c <= 0xF4 then
                if i + 3 < n then
                    local c1, c2, c3 = p[i + 1], p[i + 2], p[i + 3]
                    local lo1, hi1 = 0x80, 0xBF
                    if c == 0xF0 then lo1 = 0x90 elseif c == 0xF4 then hi1 = 0x8F end
                    if c1 >= lo1 and c1 <= hi1 and c2 >= 0x80 and c2 <= 0xBF and c3 >= 0x80 and c3 <= 0xBF then
                        len, cp = 4, (c - 0xF0) * 262144 + (c1 - 0x80) * 4096 + (c2 - 0x80) * 64 + (c3 - 0x80)
                    end
                end
            end
            if cp >= 0 then
                cls = cp_class(cp)   -- 0: word, 1: separator, 2: a token of its own
            end
        end
        if cls ~= 0 and inword then
            inword = false
            nx = token_end(nx, hs, ntok)
            prev = hc
        end
        if cls ~= 1 then
            if not inword then
                if ntok == limit then
                    return ntok, false, nx
                end
                ntok = ntok + 1
                inword = true
                hc = FNV32_OFFSET
                hs = bxor(prev, 0x20)
                hs = tobit(lshift(hs, 24) + hs * 403)   -- * 0x01000193 mod 2^32
            end
            hc, hs = fnv2(hc, hs, LOWER[c])
            if len > 1 then
                -- the continuation bytes, unrolled (no inner loop in the scan's trace)
                hc, hs = fnv2(hc, hs, p[i + 1])
                if len > 2 then
                    hc, hs = fnv2(hc, hs, p[i + 2])
                    if len > 3 then
                        hc, hs = fnv2(hc, hs, p[i + 3])
                    end
                end
                if cls == 2 then
                    inword = false   -- a CJK token ends where it starts: again below
                    nx = token_end(nx, hs, ntok)
                    prev = hc
                end
            end
        end
        i = i + len
    end
    if inword and ntok > 1 then
        nx = token_end(nx, hs, ntok)
    elseif ntok == 1 then
        -- one token: one 1-shingle, the token's own hash
        X[0] = (inword and hc or prev) % 4294967296
        nx = 1
    end
    return ntok, true, nx
end

-- The signature of the nx shingle hashes in X (docs/fingerprint.md §4): one mix per
-- shingle, a minimum per bin, then the empty bins densified. No shingle: every value
-- is 0xFFFFFFFF.
local VAL = u32_arr(NUM_PERM)
local FULL = ffi_new("uint8_t[?]", NUM_PERM)

local function minhash(nx, sig)
    ffi_fill(FULL, NUM_PERM)
    local xs = X
    for k = 0, nx - 1 do
        local z = bxor(xs[k], SEED)
        z = bxor(z, rshift(z, 30)) * MIX1
        z = bxor(z, rshift(z, 27)) * MIX2
        z = bxor(z, rshift(z, 31))
        local b = tonumber(rshift(z, BIN_SHIFT))
        local v = tonumber(band(z, M32))
        if FULL[b] == 0 or v < VAL[b] then
            VAL[b] = v
            FULL[b] = 1
        end
    end
    for i = 0, NUM_PERM - 1 do
        if FULL[i] ~= 0 then
            sig[i] = VAL[i]
        elseif nx == 0 then
            sig[i] = 0xFFFFFFFF
        else
            local j = i * NUM_PERM
            while FULL[PROBE[j]] == 0 do
                j = j + 1
            end
            sig[i] = VAL[PROBE[j]]
        end
    end
    return sig
end

-- Signature of p[0 .. n-1] (an already-masked prompt text): sig (uint32_t[NUM_PERM]),
-- tokens, complete.
function _M.signature(p, n)
    local ntok, complete, nx = scan(ffi_cast(u8p, p), n)
    return minhash(nx, u32_arr(NUM_PERM)), ntok, complete
end

-- The same for a Lua string (tests, tools).
function _M.of_text(text)
    return _M.signature(text, #text)
end

-- csf_key (FNV-1a 64 over the whole signature) and the BANDS band keys.
function _M.keys_of(sig)
    local bands = {}
    local k = 0
    for b = 0, BANDS - 1 do
        local h = bxor(FNV64_OFFSET, b) * FNV64_PRIME
        for _ = 1, ROWS do
            local v = sig[k]
            k = k + 1
            h = bxor(h, band(v, 0xFF)) * FNV64_PRIME
            h = bxor(h, band(rshift(v, 8), 0xFF)) * FNV64_PRIME
            h = bxor(h, band(rshift(v, 16), 0xFF)) * FNV64_PRIME
            h = bxor(h, rshift(v, 24)) * FNV64_PRIME
        end
        bands[b + 1] = h
    end
    local h = FNV64_OFFSET
    for i = 0, NUM_PERM - 1 do
        local v = sig[i]
        h = bxor(h, band(v, 0xFF)) * FNV64_PRIME
        h = bxor(h, band(rshift(v, 8), 0xFF)) * FNV64_PRIME
        h = bxor(h, band(rshift(v, 16), 0xFF)) * FNV64_PRIME
        h = bxor(h, rshift(v, 24)) * FNV64_PRIME
    end
    return h, bands
end

-- The signature of an explicit list of 32-bit shingle hashes (tests). Returns a
-- uint32_t[NUM_PERM] cdata.
function _M.minhash_of(xs)
    local nx = #xs
    if nx > MAX_TOKENS + 1 then
        error("zccp.fp.csf.minhash_of: too many values", 2)
    end
    for k = 1, nx do
        X[k - 1] = xs[k]
    end
    return minhash(nx, u32_arr(NUM_PERM))
end

return _M
