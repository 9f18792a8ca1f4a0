-- Fingerprints and cache keys (docs/fingerprint.md): decode the body (§1), mask it
-- (§2, zccp.masks), then the exact key (§6, zccp.fp.canonical), the prompt text (§3,
-- zccp.fp.prompt) and its CSF (§4-§5, zccp.fp.csf). engine/zccp/cache/fingerprint.py
-- is the same algorithm in Python, checked byte for byte by the golden vectors and the
-- identity test.
--
--   local fp = require "zccp.fingerprint"
--   local r, err = fp.compute("anthropic" | "openai", body)
--   r.csf_key    uint64_t cdata   FNV-1a 64 over the MinHash values
--   r.bands      { 16 x uint64_t cdata }   LSH band keys (16 bands x 8 rows)
--   r.exact_key  32-byte string   SHA-256 of the canonical masked request
--   r.signature  uint32_t[128] cdata   the MinHash signature
--   r.tokens     prompt tokens the CSF saw (<= 1024)
--   r.complete   true when the CSF saw the whole prompt
--   r.masked     true when a mask pattern changed some text
--
-- Bounded work: bodies above decode_limit (64 KiB) are not decoded here
-- (nil, "body too large to fingerprint": the engine computes the same fingerprint),
-- and tokenizing stops at the 1025th token.
local bit = require "bit"
local T = require "zccp.fp_tables"
local csf = require "zccp.fp.csf"
local canonical = require "zccp.fp.canonical"
local prompt = require "zccp.fp.prompt"
local sha256 = require "zccp.sha256"
local new_buffer = require("string.buffer").new

local type = type
local pcall = pcall
local error = error
local tostring = tostring
local tonumber = tonumber
local require = require
local str_byte = string.byte
local str_find = string.find
local str_format = string.format
local band, rshift = bit.band, bit.rshift

local _M = { _VERSION = "0.1.0" }

local DECODE_LIMIT = T.decode_limit
_M.DECODE_LIMIT = DECODE_LIMIT
_M.MAX_TOKENS = T.max_tokens

local cjson = require("cjson").new()   -- a private instance: its settings are ours alone
cjson.decode_invalid_numbers(false)
cjson.decode_max_depth(T.max_depth)
local cjson_decode = cjson.decode

local masks -- required lazily (needs ngx.re)

-- Reused for every body (compute() never yields). Buffers that grew past KEEP bytes
-- (a test's raised limit) are freed after use.
local CBUF = new_buffer(16384)   -- canonical form
local PBUF = new_buffer(16384)   -- prompt text
local KEEP = 4 * DECODE_LIMIT

-- §1: the body as a decoded JSON object, or nil, err.
local function decode(body, limit)
    if #body > (limit or DECODE_LIMIT) then
        return nil, "body too large to fingerprint"
    end
    local first = str_find(body, "[^ \t\r\n]")
    if not first or str_byte(body, first) ~= 123 then   -- '{'
        return nil, "body is not a JSON object"
    end
    local ok, doc = pcall(cjson_decode, body)
    if not ok then
        return nil, "invalid JSON: " .. tostring(doc)
    end
    if type(doc) ~= "table" then
        return nil, "body is not a JSON object"
    end
    return doc
end

-- debug: also return r.canonical and r.prompt; limit: overrides the decode limit
-- (tests; the engine covers larger bodies).
function _M.compute(api, body, debug, limit)
    if api ~= "anthropic" and api ~= "openai" then
        error("zccp.fingerprint.compute: api must be \"anthropic\" or \"openai\"", 2)
    end
    if type(body) ~= "string" then
        error("zccp.fingerprint.compute: body must be a string", 2)
    end
    local doc, err = decode(body, limit)
    if not doc then
        return nil, err
    end
    if not masks then
        masks = require "zccp.masks"
    end
    local masked, merr = masks.apply_doc(doc)
    if masked == nil then
        return nil, merr
    end

    canonical.write(CBUF, api, doc)
    local cp, clen = CBUF:ref()
    local exact, herr = sha256.digest(cp, clen)
    if not exact then
        return nil, herr
    end
    prompt.write(PBUF, api, doc)
    local pp, plen = PBUF:ref()
    local sig, ntok, complete = csf.signature(pp, plen)
    local csf_key, bands = csf.keys_of(sig)
    local r = {
        csf_key = csf_key,
        bands = bands,
        exact_key = exact,
        signature = sig,
        tokens = ntok,
        complete = complete,
        masked = masked,
    }
    if debug then
        r.canonical = CBUF:tostring()
        r.prompt = PBUF:tostring()
    end
    if clen > KEEP then
        CBUF:free()
    end
    if plen > KEEP then
        PBUF:free()
    end
    return r
end

-- 16 hex digits of a uint64_t cdata (for logs and tests)
function _M.hex64(v)
    return str_format("%08x%08x", tonumber(rshift(v, 32)), tonumber(band(v, 0xFFFFFFFFULL)))
end

return _M
