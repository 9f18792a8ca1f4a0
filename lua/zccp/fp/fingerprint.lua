-- Fingerprints and cache keys (docs/fingerprint.md, version 3): decode the body (§1),
-- mask it (§2, zccp.fp.mask_apply), then the prefix and exact keys (§6, zccp.fp.canonical), the
-- final user turn (§3, zccp.fp.prompt) and, when it is text only, its CSF (§4-§5,
-- zccp.fp.csf). engine/zccp/cache/fingerprint.py is the same algorithm in Python,
-- checked byte for byte by the golden vectors and the identity test.
--
--   local fp = require "zccp.fp.fingerprint"
--   local r, err = fp.compute("anthropic" | "openai", body)   -- or fp.keys(...), then fp.complete(r)
--   r.exact_key  32-byte string   SHA-256: the prefix key and the final message
--   r.prefix_key 32-byte string   SHA-256 of the canonical masked request without its final message
--   r.near       true when near-duplicate hits are allowed (a text-only final user turn
--                of 1..1024 tokens); then also:
--   r.csf_key    uint64_t cdata   FNV-1a 64 over the MinHash values
--   r.bands      { 16 x uint64_t cdata }   LSH band keys (16 bands x 8 rows)
--   r.signature  uint32_t[128] cdata   the MinHash signature of the final user turn
--   r.tokens     tokens of the final user turn the CSF saw (0 when not near)
--   r.masked     true when a mask pattern changed some text
--   r.end_user   metadata.user_id (anthropic) / user (openai) when a string: not part of
--                the fingerprint, a tenant source (zccp.lib.tenant)
--   r.stream, r.include_usage   "stream": true, and OpenAI's stream_options.include_usage:
--                not part of the fingerprint, but the answer shows them (zccp.plugins.l1.cache)
--   r.model      the body's "model" when a string (zccp.plugins.router.route: the engines that serve it)
--   r.route_key  32-byte string   the conversation's routing key (fp.route_key(api, body,
--                endpoint): the same for a body keys() is not asked for) (zccp.plugins.router.route; the front tier's
--                too): SHA-256 of "zccp-route-v1\n" and, from the canonical masked form (§6), the
--                values of model, system and tools and the messages up to and including the
--                first "user" message (all of them when none is), every "cache_control"
--                member left out (the breakpoint moves to the last block every turn). Unlike prefix_key (all but the
--                final message, so a new one every turn) it stays the same across the turns of
--                a conversation: each turn lands on the replica whose prefix cache holds the
--                earlier ones. Not part of docs/fingerprint.md (nginx only; the engine never
--                computes it).
--
-- Bounded work: bodies above decode_limit (64 KiB) are not decoded here
-- (nil, "body too large to fingerprint": the engine computes the same fingerprint),
-- and tokenizing stops at the 1025th token.
local ffi = require "ffi"
local bit = require "bit"
local T = require "zccp.fp.tables"
local csf = require "zccp.fp.csf"
local canonical = require "zccp.fp.canonical"
local prompt = require "zccp.fp.prompt"
local sha256 = require "zccp.lib.sha256"
local new_buffer = require("string.buffer").new

local type = type
local pcall = pcall
local error = error
local tostring = tostring
local tonumber = tonumber
local ffi_cast = ffi.cast
local require = require
local str_byte = string.byte
local str_find = string.find
local str_format = string.format
local str_sub = string.sub
local band, rshift = bit.band, bit.rshift

local _M = { _VERSION = "0.2.0" }

local DECODE_LIMIT = T.decode_limit
_M.DECODE_LIMIT = DECODE_LIMIT
_M.MAX_TOKENS = T.max_tokens
-- A body this module does not fingerprint routes by its first bytes (zccp.plugins.router.route, zccp.front.tier):
-- an SDK writes a conversation's start the same way every turn.
_M.ROUTE_RAW_BYTES = 4096

local cjson = require("cjson").new()   -- a private instance: its settings are ours alone
cjson.decode_invalid_numbers(false)
cjson.decode_max_depth(T.max_depth)
local cjson_decode = cjson.decode

local mask_apply -- required lazily (needs ngx.re)

-- Reused for every body (compute() never yields). Buffers that grew past KEEP bytes
-- (a test's raised limit) are freed after use.
local CBUF = new_buffer(16384)   -- canonical form
local PBUF = new_buffer(16384)   -- the final user turn's text blocks, joined
local KEEP = 4 * DECODE_LIMIT

local EXACT_PREFIX = T.exact_prefix
local ROUTE_HEAD = "zccp-route-v1\n"
local PREFIX_HEAD = {   -- the prefix key's first bytes, per API
    anthropic = T.prefix_prefix .. "anthropic\n",
    openai = T.prefix_prefix .. "openai\n",
}
local u8p = ffi.typeof("const uint8_t *")

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

-- The end user a request names (a tenant source): a string, or nil.
local function end_user(api, doc)
    local u
    if api == "anthropic" then
        local meta = doc.metadata
        u = type(meta) == "table" and meta.user_id or nil
    else
        u = doc.user
    end
    return type(u) == "string" and u or nil
end

-- §3-§5 for a result of keys(): r.near, r.tokens, r.signature, r.csf_key, r.bands.
-- (r.doc, the decoded and masked body keys() kept, is dropped here.)
local function complete(r, debug)
    local doc = r.doc
    r.doc = nil
    if not doc then
        return r
    end
    local tp, tlen = prompt.final_turn(PBUF, doc)
    if tp then
        local sig, ntok, complete_ = csf.signature(tp, tlen)
        if complete_ and ntok > 0 then
            r.near, r.tokens, r.signature = true, ntok, sig
            r.csf_key, r.bands = csf.keys_of(sig)
        end
    end
    if debug then
        r.prompt = tp and (type(tp) == "string" and tp or ffi.string(tp, tlen)) or nil
    end
    if tlen and tlen > KEEP then
        PBUF:free()
    end
    return r
end

-- The keys only (§1, §2, §6): what an L1 lookup needs (zccp.plugins.l1.cache); complete(r) adds the
-- rest before the request goes to the engine. Same results and errors as compute().
function _M.keys(api, body, debug, limit)
    if api ~= "anthropic" and api ~= "openai" then
        error("zccp.fp.fingerprint.compute: api must be \"anthropic\" or \"openai\"", 2)
    end
    if type(body) ~= "string" then
        error("zccp.fp.fingerprint.compute: body must be a string", 2)
    end
    local doc, err = decode(body, limit)
    if not doc then
        return nil, err
    end
    local opts = doc.stream_options
    local stream, include_usage = doc.stream == true, type(opts) == "table" and opts.include_usage == true
    if not mask_apply then
        mask_apply = require "zccp.fp.mask_apply"
    end
    local masked, merr = mask_apply.apply_doc(doc)
    if masked == nil then
        return nil, merr
    end

    -- §6: the prefix key (all but the final message) and the exact key (the prefix key
    -- and the final message), both hashed from the one canonical form in CBUF
    local cut, first, stop, inexact = canonical.write(CBUF, api, doc)
    if inexact then
        return nil, "a number beyond 2^53: the engine fingerprints this body"
    end
    local cp, clen = CBUF:ref()
    cp = ffi_cast(u8p, cp)
    local head = PREFIX_HEAD[api]
    local prefix, herr, exact
    if cut then
        prefix, herr = sha256.digest_parts(head, #head, cp, cut, cp + stop, clen - stop)
        if prefix then
            exact, herr = sha256.digest_parts(EXACT_PREFIX, #EXACT_PREFIX, prefix, 32, cp + first, stop - first)
        end
    else
        prefix, herr = sha256.digest_parts(head, #head, cp, clen)
        if prefix then
            exact, herr = sha256.digest_parts(EXACT_PREFIX, #EXACT_PREFIX, prefix, 32)
        end
    end
    if not exact then
        return nil, herr
    end
    local spans, nspans = canonical.route_spans()
    local model = doc.model
    local r = {
        model = type(model) == "string" and model or nil,
        route_key = sha256.digest_spans(ROUTE_HEAD, cp, spans, nspans),
        exact_key = exact,
        prefix_key = prefix,
        near = false,
        tokens = 0,
        masked = masked,
        end_user = end_user(api, doc),
        stream = stream,
        include_usage = include_usage,
    }
    if debug then
        r.canonical = CBUF:tostring()
    end
    if clen > KEEP then
        CBUF:free()
    end
    r.doc = doc   -- for complete()
    return r
end

function _M.complete(r)
    return complete(r)
end

-- The route key of a body keys() was not asked for (zccp.plugins.router.route, zccp.front.tier): a request
-- that neither reads nor writes the cache (no-cache + no-store), /v1/responses
-- (endpoint "responses": instructions, tools and `input` through its first user item
-- play system, tools and messages; a string input is that user item), /v1/completions,
-- or a body keys() refuses. A body it can decode gets keys()'s route key (masked, the same
-- bytes), so a conversation mixing cached and no-store turns keeps its replica; any
-- other body, its first ROUTE_RAW_BYTES bytes without the top-level "stream" and
-- "stream_options" members (the OpenAI SDK writes them early: a conversation mixing
-- streamed and whole turns must not move).
local RAW_VOLATILE = [["stream"\s*:\s*(?:true|false|null)\s*,?|"stream_options"\s*:\s*(?:\{[^{}]*\}|null)\s*,?]]

local function raw_route_key(body)
    local head = str_sub(body, 1, _M.ROUTE_RAW_BYTES + 256)
    local stripped = ngx.re.gsub(head, RAW_VOLATILE, "", "jo")
    local key = str_sub(stripped or head, 1, _M.ROUTE_RAW_BYTES)
    return key
end

function _M.route_key(api, body, endpoint)
    if type(body) ~= "string" then
        return ""
    end
    local doc = (endpoint == nil or endpoint == "responses") and decode(body) or nil
    if not doc then
        return raw_route_key(body)
    end
    if endpoint == "responses" then
        local input = doc.input
        if type(input) == "string" then
            input = { { role = "user", content = input } }
        end
        doc = { model = doc.model, system = doc.instructions, tools = doc.tools,
                messages = type(input) == "table" and input or nil }
    end
    if not mask_apply then
        mask_apply = require "zccp.fp.mask_apply"
    end
    if mask_apply.apply_doc(doc) == nil then
        return raw_route_key(body)
    end
    canonical.write(CBUF, api, doc)
    local cp, clen = CBUF:ref()
    local spans, nspans = canonical.route_spans()
    local key = sha256.digest_spans(ROUTE_HEAD, ffi_cast(u8p, cp), spans, nspans)
    if clen > KEEP then
        CBUF:free()
    end
    return key or raw_route_key(body)
end

-- debug: also return r.canonical (CJ of the request) and r.prompt (the final user turn's
-- text, when text only); limit: overrides the decode limit
-- (tests; the engine covers larger bodies).
function _M.compute(api, body, debug, limit)
    local r, err = _M.keys(api, body, debug, limit)
    if not r then
        return nil, err
    end
    return complete(r, debug)
end

-- 16 hex digits of a uint64_t cdata (for logs and tests)
function _M.hex64(v)
    local hex = str_format("%08x%08x", tonumber(rshift(v, 32)), tonumber(band(v, 0xFFFFFFFFULL)))
    return hex
end

return _M
