-- The keys admin API on the admin listener (zccp_admin.conf), the same records `zccp-keys`
-- writes (engine/zccp/config/keystore.py is the reference for the JSON fields; the Redis keys are
-- zccp.admin.key_layout's, which both read).
--
--   GET  /v1/zccp/keys[?tenant=T]         every key (never a secret)
--   POST /v1/zccp/keys                    {"tenant", "name", "models": [...], "expires_in_s",
--                                          "limits": {"rpm", "itpm", ...}} -> the key, shown once
--   POST /v1/zccp/keys/<id>/revoke        refused everywhere within auth.cache_ttl_s
--   POST /v1/zccp/keys/<id>/rotate        {"grace_s": n} -> a new secret for the same key
local ffi = require "ffi"
local cjson = require "cjson.safe"
local sha256 = require "zccp.lib.sha256"
local settings = require "zccp.settings"
local redis = require "zccp.lib.redis"
local admin = require "zccp.admin.gate"
local errors = require "zccp.errors"
local layout = require "zccp.admin.key_layout"

local ngx = ngx
local ngx_var = ngx.var
local type = type
local pairs = pairs
local ipairs = ipairs
local tostring = tostring
local str_gsub = string.gsub
local str_find = string.find
local str_sub = string.sub
local math_floor = math.floor
local tonumber = tonumber

local _M = { _VERSION = "0.1.0" }

local RECORD = layout.record
local INDEX = layout.index
local LIMIT_NAMES = layout.limit_names

local target

local function store()
    if not target then
        local a = settings.get().auth
        if not a or a.mode ~= "keys" then
            return nil
        end
        target = redis.target(a.redis)
    end
    return target
end

local function random_bytes(n)
    local buf = ffi.new("unsigned char[?]", n)
    local ok, err = sha256.random_into(buf, n)
    if not ok then
        return nil, err
    end
    local bytes = ffi.string(buf, n)
    return bytes
end

local function new_secret()
    local raw, err = random_bytes(32)
    if not raw then
        return nil, err
    end
    local b64 = str_gsub(str_gsub(ngx.encode_base64(raw), "+", "-"), "/", "_")
    return "zk_" .. str_gsub(b64, "=", "")
end

local function reply(status, obj)
    ngx.status = status
    ngx.header["Content-Type"] = "application/json"
    ngx.print(cjson.encode(obj))
end

local function bad(msg)
    return errors.send("anthropic", 400, "invalid_request_error", msg)
end

local function view(entry)
    local rec = entry.record
    local v = {}
    for k, x in pairs(rec) do
        v[k] = x
    end
    v.revoked_at = entry.revoked_at ~= 0 and entry.revoked_at or cjson.null
    local exp = tonumber(rec.expires_at) or 0
    v.status = entry.revoked_at ~= 0 and "revoked" or (exp > 0 and exp <= ngx.now() and "expired" or "active")
    return v
end

local function write(t, rec, secret, old)
    local h = sha256.hex(sha256.digest(secret, #secret), 32)
    local body = cjson.encode(rec)
    local ok, err
    if rec.expires_at > 0 then
        ok, err = t:call("SET", RECORD .. h, body, "EX", math_floor(rec.expires_at - ngx.now()) + 60)
    else
        ok, err = t:call("SET", RECORD .. h, body)
    end
    if not ok then
        return nil, err
    end
    return t:call("HSET", INDEX, rec.id, cjson.encode({ record = rec, hash = h, revoked_at = 0, old_hashes = old }))
end

local function get_entry(t, id)
    local raw, err = t:call("HGET", INDEX, id)
    if err then
        return nil, err
    end
    return raw and cjson.decode(raw) or false
end

-- Writes a key's record and answers it with its secret (shown once): create and rotate.
local function save_and_answer(t, rec, secret, old, status)
    local ok, err = write(t, rec, secret, old)
    if not ok then
        return errors.send("anthropic", 503, "overloaded_error", "key store: " .. tostring(err))
    end
    local out = { key = secret }
    for k, v in pairs(rec) do
        out[k] = v
    end
    return reply(status, out)
end

local function create(t, doc)
    if type(doc) ~= "table" or type(doc.tenant) ~= "string" or not str_find(doc.tenant, "^[%w._:@-]+$")
            or #doc.tenant > 128 then
        return bad("tenant: 1-128 of letters, digits and . _ : @ -")
    end
    local limits = {}
    if doc.limits ~= nil then
        if type(doc.limits) ~= "table" then
            return bad("limits: expected an object")
        end
        for _, name in ipairs(LIMIT_NAMES) do
            local v = doc.limits[name]
            if v ~= nil then
                if type(v) ~= "number" or v < 0 or v ~= math_floor(v) then
                    return bad("limits." .. name .. ": expected an integer >= 0")
                end
                if v > 0 then
                    limits[name] = v
                end
            end
        end
    end
    local models = {}
    if doc.models ~= nil then
        if type(doc.models) ~= "table" then
            return bad("models: expected a list of model names")
        end
        for _, m in ipairs(doc.models) do
            if type(m) ~= "string" then
                return bad("models: expected a list of model names")
            end
            models[#models + 1] = m
        end
    end
    local expires = 0
    if doc.expires_in_s ~= nil then
        if type(doc.expires_in_s) ~= "number" or doc.expires_in_s <= 0 then
            return bad("expires_in_s: expected a number of seconds > 0")
        end
        expires = ngx.now() + doc.expires_in_s
    end
    local secret, serr = new_secret()
    local idr = random_bytes(6)
    if not secret or not idr then
        return errors.send("anthropic", 500, "api_error", "no random bytes: " .. tostring(serr))
    end
    local rec = { id = "key_" .. sha256.hex(idr, 6), tenant = doc.tenant,
                  name = type(doc.name) == "string" and doc.name or "", models = models,
                  expires_at = expires, created_at = ngx.now(), limits = limits, hint = str_sub(secret, 1, 8) }
    return save_and_answer(t, rec, secret, {}, 201)
end

local function revoke(t, id)
    local e, err = get_entry(t, id)
    if e == nil then
        return errors.send("anthropic", 503, "overloaded_error", "key store: " .. tostring(err))
    end
    if not e then
        return errors.send("anthropic", 404, "not_found_error", "no such key: " .. id)
    end
    t:call("DEL", RECORD .. e.hash)
    for _, h in ipairs(type(e.old_hashes) == "table" and e.old_hashes or {}) do
        t:call("DEL", RECORD .. h)
    end
    if (tonumber(e.revoked_at) or 0) == 0 then
        e.revoked_at = ngx.now()
    end
    e.old_hashes = {}
    local ok, werr = t:call("HSET", INDEX, id, cjson.encode(e))
    if not ok then
        return errors.send("anthropic", 503, "overloaded_error", "key store: " .. tostring(werr))
    end
    return reply(200, view(e))
end

local function rotate(t, id, doc)
    local e, err = get_entry(t, id)
    if e == nil then
        return errors.send("anthropic", 503, "overloaded_error", "key store: " .. tostring(err))
    end
    if not e or (tonumber(e.revoked_at) or 0) ~= 0 then
        return errors.send("anthropic", 404, "not_found_error", "no such key: " .. id)
    end
    local grace = type(doc) == "table" and tonumber(doc.grace_s) or 0
    local secret, serr = new_secret()
    if not secret then
        return errors.send("anthropic", 500, "api_error", "no random bytes: " .. tostring(serr))
    end
    local old = {}
    if grace > 0 then
        t:call("EXPIRE", RECORD .. e.hash, math_floor(grace))
        old[1] = e.hash
    else
        t:call("DEL", RECORD .. e.hash)
    end
    local rec = e.record
    rec.created_at, rec.hint = ngx.now(), str_sub(secret, 1, 8)
    return save_and_answer(t, rec, secret, old, 200)
end

local function list(t)
    local flat, err = t:call("HGETALL", INDEX)
    if not flat then
        if err then
            return errors.send("anthropic", 503, "overloaded_error", "key store: " .. tostring(err))
        end
        flat = {}
    end
    local want = ngx.req.get_uri_args().tenant
    local out = {}
    for i = 2, #flat, 2 do
        local e = cjson.decode(flat[i])
        if type(e) == "table" and type(e.record) == "table" and (not want or e.record.tenant == want) then
            out[#out + 1] = view(e)
        end
    end
    if #out == 0 then
        ngx.header["Content-Type"] = "application/json"
        return ngx.print("[]")
    end
    return reply(200, out)
end

function _M.serve()
    if not admin.allowed("anthropic") then
        return
    end
    local t = store()
    if not t then
        return errors.send("anthropic", 409, "invalid_request_error", "keys are off (auth.mode: off)")
    end
    local method = ngx.req.get_method()
    local id, op = ngx_var.zccp_key_id, ngx_var.zccp_key_op
    if method == "GET" and (not id or id == "") then
        return list(t)
    end
    if method ~= "POST" then
        return errors.send("anthropic", 405, "invalid_request_error", "use GET or POST", { Allow = "GET, POST" })
    end
    ngx.req.read_body()
    local raw = ngx.req.get_body_data()
    local doc = raw and raw ~= "" and cjson.decode(raw) or {}
    if doc == nil then
        return bad("the body is not JSON")
    end
    if not id or id == "" then
        return create(t, doc)
    end
    if op == "revoke" then
        return revoke(t, id)
    end
    return rotate(t, id, doc)
end

return _M
