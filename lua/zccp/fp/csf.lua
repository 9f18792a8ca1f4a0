-- The content-similarity fingerprint (docs/fingerprint.md §4-§5): tokens, word
-- 2-shingles, the MinHash signature, LSH band keys and csf_key, read straight from
-- memory (a pointer and a length: no Lua string of the text is needed).
-- engine/zccp/cache/fp/csf.py is the same algorithm in Python, byte for byte.
--
--   local csf = require "zccp.fp.csf"
--   local sig, ntok, complete = csf.signature(ptr, len)   -- uint32_t[NUM_PERM], tokens, all seen?
--   local csf_key, bands = csf.keys_of(sig)                -- uint64_t, { BANDS x uint64_t }
local ffi = require "ffi"
local bit = require "bit"
local T = require "zccp.fp_tables"
local abi = require("zccp.abi").init()

local error = error
local tostring = tostring
local ipairs = ipairs
local ffi_new = ffi.new
local ffi_cast = ffi.cast
local band, bxor, lshift, rshift, tobit = bit.band, bit.bxor, bit.lshift, bit.rshift, bit.tobit

local _M = { _VERSION = "0.1.0" }

local MAX_TOKENS = T.max_tokens
local NUM_PERM = abi.C.ZCCP_MINHASH_COUNT   -- the slot holds the signature and the bands
local BANDS = abi.C.ZCCP_CSF_BANDS
local ROWS = NUM_PERM / BANDS

_M.MAX_TOKENS = MAX_TOKENS
_M.NUM_PERM = NUM_PERM

local u64 = ffi.typeof("uint64_t")
local u64_arr = ffi.typeof("uint64_t[?]")
local u32_arr = ffi.typeof("uint32_t[?]")
local P61 = 0x1FFFFFFFFFFFFFFFULL
local M32 = 0xFFFFFFFFULL
local FNV64_OFFSET = 0xCBF29CE484222325ULL
local FNV64_PRIME = 0x100000001B3ULL

-- ------------------------------------------------------------------ MinHash parameters

-- a_i = AH[i] * 2^29 + AL[i] (AH < 2^32, AL < 2^29), b_i = B[i]: with x < 2^32 every
-- product below fits in 64 bits (see minhash()).
local AH = u64_arr(NUM_PERM)
local AL = u64_arr(NUM_PERM)
local B = u64_arr(NUM_PERM)
local M29 = 0x1FFFFFFFULL
assert(NUM_PERM % 2 == 0)

do
    local state = u64(T.seed_hi) * 0x100000000ULL + u64(T.seed_lo)
    local function splitmix64()
        state = state + 0x9E3779B97F4A7C15ULL
        local z = state
        z = bxor(z, rshift(z, 30)) * 0xBF58476D1CE4E5B9ULL
        z = bxor(z, rshift(z, 27)) * 0x94D049BB133111EBULL
        return bxor(z, rshift(z, 31))
    end
    for i = 0, NUM_PERM - 1 do
        local a = 0ULL
        while a == 0ULL do
            a = splitmix64() % P61
        end
        AH[i] = rshift(a, 29)
        AL[i] = band(a, M29)
        B[i] = splitmix64() % P61
    end
end

-- ------------------------------------------------------------------ code point classes

local R_LO, R_HI, R_CL, NR = {}, {}, {}, 0
for _, r in ipairs(T.ranges) do
    NR = NR + 1
    R_LO[NR], R_HI[NR] = r[1], r[2]
    if r[3] == "S" then
        R_CL[NR] = 1
    elseif r[3] == "C" then
        R_CL[NR] = 2
    else
        error("zccp.fp_tables: unknown class " .. tostring(r[3]))
    end
end

-- 0: word, 1: separator, 2: CJK (a token of its own)
local function cp_class(cp)
    local lo, hi = 1, NR
    while lo <= hi do
        local mid = rshift(lo + hi, 1)
        if cp < R_LO[mid] then
            hi = mid - 1
        elseif cp > R_HI[mid] then
            lo = mid + 1
        else
            return R_CL[mid]
        end
    end
    return 0
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

local X = u64_arr(MAX_TOKENS + 1) -- distinct shingle hashes
local u8p = ffi.typeof("const uint8_t *")

-- A set of the shingle hashes of one scan (open addressing, at most MAX_TOKENS entries
-- in HS_SIZE slots); a slot belongs to the current scan when HS_GEN[slot] == gen.
local HS_SIZE = 4096
assert(HS_SIZE >= 2 * MAX_TOKENS)
local HS_KEY = ffi_new("uint32_t[?]", HS_SIZE)
local HS_GEN = ffi_new("uint32_t[?]", HS_SIZE)
local hs_gen = 0

local FNV32_OFFSET = tobit(0x811C9DC5)

-- Adds shingle hash hs to X unless this scan (gen) has it already; returns the new count.
-- Small enough for LuaJIT to inline into the scan's trace.
local function add_shingle(hs, gen, nx)
    local x = hs % 4294967296
    local slot = band(hs, HS_SIZE - 1)
    while true do
        if HS_GEN[slot] ~= gen then
            HS_GEN[slot] = gen
            HS_KEY[slot] = x
            X[nx] = x
            return nx + 1
        elseif HS_KEY[slot] == x then
            return nx
        end
        slot = band(slot + 1, HS_SIZE - 1)
    end
end

-- Tokenizes p[0 .. n-1] and hashes the shingles in the same pass: each token's FNV-1a 32
-- (hc) and, from the previous token's hash followed by 0x20, the shingle's (hs) are
-- carried along byte by byte (bytes lowercased through LOWER). Returns the number of
-- tokens kept, whether that was all of them, and the number of distinct shingle
-- hashes written to X.
local function scan(p, n)
    hs_gen = hs_gen + 1
    if hs_gen >= 4294967295 then
        ffi.fill(HS_GEN, HS_SIZE * 4)
        hs_gen = 1
    end
    local gen = hs_gen
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
            -- the word ends: its shingle with the previous token
            inword = false
            if ntok > 1 then
                nx = add_shingle(hs, gen, nx)
            end
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
            local b = LOWER[c]
            hc = bxor(hc, b)
            hc = tobit(lshift(hc, 24) + hc * 403)
            hs = bxor(hs, b)
            hs = tobit(lshift(hs, 24) + hs * 403)
            if len > 1 then
                for k = i + 1, i + len - 1 do
                    b = p[k]
                    hc = bxor(hc, b)
                    hc = tobit(lshift(hc, 24) + hc * 403)
                    hs = bxor(hs, b)
                    hs = tobit(lshift(hs, 24) + hs * 403)
                end
                if cls == 2 then
                    inword = false   -- a CJK token ends where it starts: again below
                    if ntok > 1 then
                        nx = add_shingle(hs, gen, nx)
                    end
                    prev = hc
                end
            end
        end
        i = i + len
    end
    if inword and ntok > 1 then
        nx = add_shingle(hs, gen, nx)
    elseif ntok == 1 then
        -- one token: one 1-shingle, the token's own hash
        X[0] = (inword and hc or prev) % 4294967296
        nx = 1
    end
    return ntok, true, nx
end

-- sig[i] = min over X of ((a_i * x + b_i) mod P) & 0xffffffff, P = 2^61 - 1.
--
-- With a = ah * 2^29 + al and x < 2^32: h = ah * x < 2^64 and
--   a*x + b = h * 2^29 + al*x + b == (h mod 2^32) * 2^29 + (h >> 32) + al*x + b   (2^61 == 1 mod P)
-- so s = ((h & M32) << 29) + (h >> 32) + al*x + b < 2^63 and s == a*x + b (mod P).
-- s mod P is r = (s & P) + (s >> 61), less P if r >= P. Unless s & P >= P - 3 (then r
-- could reach P: the exact slow path), r < P and its low 32 bits are those of
-- s + (s >> 61), since s - (s & P) is a multiple of 2^61.
-- The minimum is kept as a number: tobit() of the low 32 bits xor 2^31 orders like
-- the unsigned value. Two functions per pass over X.
local P61_3 = P61 - 3
local BIAS = 0x80000000
local min = math.min

local function slow_low32(s)
    local r = band(s, P61) + rshift(s, 61)
    if r >= P61 then
        r = r - P61
    end
    return bxor(tobit(r), BIAS)
end

local function minhash(nx, sig)
    local xs = X
    for i = 0, NUM_PERM - 1, 2 do
        local ah1, al1, b1 = AH[i], AL[i], B[i]
        local ah2, al2, b2 = AH[i + 1], AL[i + 1], B[i + 1]
        local m1, m2 = 0x7FFFFFFF, 0x7FFFFFFF
        for k = 0, nx - 1 do
            local x = xs[k]
            local h1 = ah1 * x
            local h2 = ah2 * x
            local s1 = lshift(band(h1, M32), 29) + rshift(h1, 32) + al1 * x + b1
            local s2 = lshift(band(h2, M32), 29) + rshift(h2, 32) + al2 * x + b2
            if band(s1, P61) >= P61_3 or band(s2, P61) >= P61_3 then
                m1 = min(m1, slow_low32(s1))
                m2 = min(m2, slow_low32(s2))
            else
                m1 = min(m1, bxor(tobit(s1 + rshift(s1, 61)), BIAS))
                m2 = min(m2, bxor(tobit(s2 + rshift(s2, 61)), BIAS))
            end
        end
        sig[i] = bxor(m1, BIAS) % 4294967296
        sig[i + 1] = bxor(m2, BIAS) % 4294967296
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

-- MinHash of an explicit list of 32-bit shingle hashes (tests: with one value x,
-- signature[i] is h_i(x) itself). Returns a uint32_t[128] cdata.
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
