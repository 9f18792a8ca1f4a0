-- API keys (auth.mode: keys): the caller's key, from x-api-key or Authorization: Bearer,
-- verified before the body is read and any slot is claimed; the key's record gives the
-- tenant (the cache's, zccp.lib.tenant), its allowed models and its limits (the limits plugin).
--
-- Only the key's SHA-256 is stored: a Redis key (zccp.admin.key_layout's `record` .. <hex>) holds the record as JSON
-- (written by `zccp-keys`, zccp.ops.keys / zccp.keys). Each worker keeps verified records
-- for auth.cache_ttl_s and unknown keys for auth.negative_ttl_s (resty.lrucache), so a
-- known key costs no Redis round trip; a revoked key is refused by every host within
-- auth.cache_ttl_s. Redis unreachable and the key not cached: 503 (never let it in).
--
--   local who = auth.admit(api)        -- nil: answered (401/503); else the caller (or auth.OFF)
--   if not auth.allow_model(who, api, body) then return end   -- 404 answered
local cjson = require "cjson.safe"
local lrucache = require "resty.lrucache"
local settings = require "zccp.settings"
local sha256 = require "zccp.lib.sha256"
local tenant = require "zccp.lib.tenant"
local errors = require "zccp.errors"
local redis = require "zccp.lib.redis"
local metrics = require "zccp.lib.metrics"
local layout = require "zccp.admin.key_layout"

local ngx = ngx
local ngx_now = ngx.now
local type = type
local tonumber = tonumber
local pairs = pairs
local ipairs = ipairs
local decode = cjson.decode
local table_concat = table.concat

local _M = { _VERSION = "0.1.0" }

_M.OFF = { off = true }   -- the caller when auth is off: every check passes

local KEY_PREFIX = layout.record
local TENANT_PREFIX = layout.tenant   -- a tenant's limits (zccp-keys tenant), JSON
local CACHE_ITEMS = 10000
local MAX_KEY_LEN = 256

local cache        -- this worker's verified (record) and unknown (false) keys
local target       -- the Redis the records live in

local function conf()
    return settings.get().auth
end

local function redis_target()
    if not target then
        target = redis.target(conf().redis)
    end
    return target
end

-- A record as `zccp-keys` writes it (decoded); anything malformed counts as no key.
local function parse_doc(rec)
    if type(rec) ~= "table" or type(rec.tenant) ~= "string" or rec.tenant == "" or type(rec.id) ~= "string" then
        return nil
    end
    local models = rec.models
    if models ~= nil and type(models) ~= "table" then
        return nil
    end
    local allowed
    if models and #models > 0 then
        allowed = {}
        for _, m in pairs(models) do
            if type(m) == "string" then
                allowed[m] = true
            end
        end
    end
    local expires = tonumber(rec.expires_at) or 0
    if type(rec.limits) ~= "table" then
        rec.limits = {}
    end
    return {
        id = rec.id,
        tenant = rec.tenant,
        tenant_digest = sha256.digest(rec.tenant, #rec.tenant),   -- the cache's tenant (zccp.lib.tenant)
        models = allowed,
        expires_at = expires > 0 and expires or nil,
        limits = rec.limits,
    }
end

local function parse(raw)
    return parse_doc(decode(raw))
end

local function tenant_limits_of(t)
    return type(t) == "table" and type(t.limits) == "table" and t.limits or {}
end

-- auth.keys_file (one host's keys, hashes only): sha256 hex -> record. Read when this module
-- loads in the master (init_by_lua: at start and at every reload), else at first use.
local file_keys

local function load_keys_file()
    file_keys = {}
    local c = conf()
    local path = c and c.keys_file
    if not path or path == "" then
        return
    end
    local f, err = io.open(path, "rb")
    if not f then
        ngx.log(ngx.ERR, "zccp: auth.keys_file ", path, ": ", err)
        return
    end
    local doc = decode(f:read("*a") or "")
    f:close()
    if type(doc) ~= "table" or type(doc.keys) ~= "table" then
        ngx.log(ngx.ERR, "zccp: auth.keys_file ", path, ": not {\"keys\": [...]}; no key read from it")
        return
    end
    local tenants = type(doc.tenants) == "table" and doc.tenants or {}
    for _, k in ipairs(doc.keys) do
        local hex = type(k) == "table" and type(k.sha256) == "string" and #k.sha256 == 64 and k.sha256:lower()
        local rec = hex and parse_doc(k)
        if rec then
            rec.tenant_limits = tenant_limits_of(tenants[rec.tenant])
            file_keys[hex] = rec
        end
    end
end

if settings.abi_header() then
    load_keys_file()
end

-- The record of a presented key: record, or false (unknown), or nil, err (Redis failed).
-- This worker's cache is keyed by the presented key itself (it is in this worker's memory
-- with the request anyway): a cached key costs no hashing.
local function lookup(key)
    local c = conf()
    if not cache then
        cache = lrucache.new(CACHE_ITEMS)
    end
    local hit = cache:get(key)
    if hit ~= nil then
        return hit
    end
    local hex = sha256.hex(sha256.digest(key, #key), 32)
    if not file_keys then
        load_keys_file()
    end
    local listed = file_keys[hex]
    if listed then
        cache:set(key, listed, c.cache_ttl_s)
        return listed
    end
    local raw, err = redis_target():call("GET", KEY_PREFIX .. hex)
    if err then
        return nil, err
    end
    local rec = raw and parse(raw) or false
    if rec then
        local traw, terr = redis_target():call("GET", TENANT_PREFIX .. rec.tenant)
        if terr then
            return nil, terr
        end
        rec.tenant_limits = tenant_limits_of(traw and decode(traw))
    end
    cache:set(key, rec, rec and c.cache_ttl_s or c.negative_ttl_s)
    return rec
end

local function count(api, result)
    metrics.count("zccp_nginx_auth_total", api, result)
end

local function refuse(api, msg)
    count(api, "unauthenticated")
    return errors.send(api, 401, "authentication_error", msg)
end

-- The caller of this request, or nil once it has been answered (401, 503).
function _M.admit(api)
    local c = conf()
    if not c or c.mode ~= "keys" then
        return _M.OFF
    end
    local key = tenant.api_key()
    if not key then
        return refuse(api, api == "openai"
            and "You didn't provide an API key. Send it as Authorization: Bearer <key>."
            or "x-api-key header is required")
    end
    if #key > MAX_KEY_LEN then
        return refuse(api, "invalid x-api-key")
    end
    local rec, err = lookup(key)
    if rec == nil then
        ngx.log(ngx.ERR, "zccp: key store unreachable: ", err)
        count(api, "store_error")
        return errors.send(api, 503, "overloaded_error", "the key store is unreachable; retry shortly",
            { ["Retry-After"] = "1" })
    end
    if not rec then
        return refuse(api, api == "openai" and "Incorrect API key provided." or "invalid x-api-key")
    end
    if rec.expires_at and ngx_now() >= rec.expires_at then
        return refuse(api, api == "openai" and "Incorrect API key provided: the key has expired."
            or "invalid x-api-key: the key has expired")
    end
    metrics.add("zccp_nginx_auth_total", api, "ok")   -- summed in the worker (zccp.lib.metrics)
    return rec
end

-- Whether this caller's body must be read whole before it is sent on (not streamed into the
-- slot): its key names models (a key with limits: the limits plugin asks too).
function _M.wants_body(who)
    return who.models ~= nil
end

local function model_of(body)
    local doc = body and decode(body)
    return type(doc) == "table" and type(doc.model) == "string" and doc.model or nil
end

-- The key may use the body's model: true, or false once answered (404, as both APIs answer
-- a model that does not exist or that the key cannot see).
function _M.allow_model(who, api, body)
    if not who.models then
        return true
    end
    local m = model_of(body)
    if m and who.models[m] then
        return true
    end
    return _M.refuse_model(api, m or "")
end

-- The 404 both APIs answer for a model that does not exist or that the key cannot see.
function _M.refuse_model(api, m)
    count(api, "model_refused")
    if api == "openai" then
        ngx.status = 404
        ngx.header["Content-Type"] = "application/json"
        ngx.print(cjson.encode({ error = {
            message = "The model `" .. m .. "` does not exist or you do not have access to it.",
            type = "invalid_request_error", param = cjson.null, code = "model_not_found" } }))
        return false
    end
    errors.send(api, 404, "not_found_error", "model: " .. m)
    return false
end

-- GET /v1/models/{id} (id: the path's model): true when the key may use it, false once
-- answered 404 as for a model that does not exist (its list leaves it out too).
function _M.allow_model_id(who, api, id)
    if not id or not who.models or who.models[id] then
        return true
    end
    return _M.refuse_model(api, id)
end

-- GET /v1/models for a key limited to some models: the engine's list (its bytes, parts)
-- with only those, re-encoded; nil when the list needs no change (no such key, another
-- request, a body that is not a list). r: the request (r.who: its caller).
function _M.models_body(r, parts)
    local who = r.kind == "models" and r.who
    local allowed = who and who.models
    if not allowed then
        return nil
    end
    local doc = decode(table_concat(parts))
    if type(doc) ~= "table" or type(doc.data) ~= "table" then
        return nil
    end
    local kept = {}
    for _, m in ipairs(doc.data) do
        if type(m) == "table" and allowed[m.id] then
            kept[#kept + 1] = m
        end
    end
    doc.data = kept[1] and kept or nil
    if doc.first_id ~= nil then   -- Anthropic's page bounds
        doc.first_id = kept[1] and kept[1].id or cjson.null
        doc.last_id = kept[#kept] and kept[#kept].id or cjson.null
    end
    local out = cjson.encode(doc)
    if not kept[1] then   -- Debian's cjson has no empty array: [] written here, not {}
        out = out == "{}" and '{"data":[]}' or '{"data":[],' .. out:sub(2)
    end
    return out
end

-- Forget every verified and unknown key of this worker (tests, an operator's reload).
function _M.flush()
    if cache then
        cache:flush_all()
    end
end

return _M
