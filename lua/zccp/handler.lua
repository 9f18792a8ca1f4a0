-- The request path's entry points: the core's own checks (method, content type, size,
-- the admin listener), then the plugin chain (zccp.core.pipeline) around the transport
-- (zccp.core.attempts, zccp.core.transport). Every concern is a plugin: docs/plugins.md.
local abi = require "zccp.lib.abi"
local errors = require "zccp.errors"
local settings = require "zccp.settings"
local body_mod = require "zccp.core.body"
local DECODE_LIMIT = require("zccp.fp.tables").decode_limit
local admin_gate = require "zccp.admin.gate"
local pipeline = require "zccp.core.pipeline"
local core = require "zccp.core.attempts"
local edges = require "zccp.core.edges"
local request_headers = require "zccp.core.request_headers"
local R_MT = require("zccp.core.request_view").MT
local watch_client = require("zccp.core.client_gone").watch
local new_request_id = require("zccp.core.request_id").new
local mono_s = require("zccp.lib.libc").mono_s

local get_request = require("resty.core.base").get_request
local ffi_cast = require("ffi").cast

local ngx = ngx
local ngx_on_abort = ngx.on_abort
local ngx_var = ngx.var
local ngx_header = ngx.header
local ngx_now = ngx.now
local ngx_log = ngx.log
local ngx_ERR = ngx.ERR
local tonumber = tonumber
local error = error
local xpcall = xpcall
local traceback = debug.traceback
local setmetatable = setmetatable
local run = pipeline.run
local DONE = pipeline.DONE
local is_json = request_headers.is_json
local cache_flags = request_headers.cache_flags

local _M = { _VERSION = "0.2.0" }

-- Admin requests (kinds "purge", "warmup") answer on the admin listener only, with its
-- token (zccp.admin.gate); the model endpoints anyone may call: count_tokens, models.
local ADMIN_KINDS = { purge = "ZCCP_KIND_PURGE", warmup = "ZCCP_KIND_WARMUP" }
local MODEL_KINDS = { count_tokens = "ZCCP_KIND_COUNT_TOKENS", models = "ZCCP_KIND_MODELS" }
local ENDPOINTS = { completions = true, responses = true }

-- Step 1, before any body byte is read: who may call (admin kinds: the admin listener),
-- the method, the content type and the declared size. Returns true and the declared
-- Content-Length (nil when there is none), or false once the request is answered.
local function admit(api, kind, s)
    if kind and ADMIN_KINDS[kind] and not admin_gate.allowed(api) then
        return false
    end
    local method = ngx.req.get_method()
    local want = kind == "models" and "GET" or "POST"
    if method ~= want then
        errors.send(api, 405, "invalid_request_error", "method " .. method .. " not allowed; use " .. want,
            { Allow = want })
        return false
    end
    local ct = ngx_var.content_type
    if want == "POST" and ct and not is_json(ct) then
        errors.send(api, 415, "invalid_request_error",
            "content-type " .. ct .. " is not supported; send application/json")
        return false
    end
    local len = tonumber(ngx_var.content_length)
    if len and len > s.max_body then
        errors.send(api, 413, "request_too_large",
            "request body of " .. len .. " bytes exceeds the limit of " .. s.max_body .. " bytes")
        return false
    end
    return true, len
end

-- The payload as fill_slot takes it: { body = string }, or { len = n, deadline = t } for a
-- body streamed later straight into the slot; nil once the request is answered (a body
-- that could not be read). GET /v1/models/{id}: the id is the payload.
local function payload(api, kind, len, max_body, deadline, whole)
    if kind == "models" then
        return { body = edges.model_id(ngx_var.uri) or "" }
    end
    if body_mod.streamable(len, DECODE_LIMIT) and not whole then
        return { len = len, deadline = deadline }
    end
    local body, code, err_kind, msg = body_mod.read(max_body, deadline)
    if not body then
        errors.send(api, code, err_kind, msg)
        if code == 408 then
            return ngx.exit(ngx.HTTP_OK)   -- the answer is out; stops the pending body read (body.read)
        end
        return nil
    end
    return { body = body }
end

-- Step 2: the body (whole when a plugin asks, else streamed into the slot later) and the
-- slot flags, then the phases prepare, keys and route. Returns r, or nil once answered.
local function prepare(r, s, len)
    local kind = r.kind
    r.deadline = ngx_now() + s.request_timeout_ms / 1000
    local whole = pipeline.any("wants_body", r)
    if whole == DONE then   -- a plugin raised: its 500 is the answer
        return nil
    end
    local src = payload(r.api, kind, len, s.max_body, r.deadline, whole)
    if not src then
        return nil
    end
    local body = src.body
    r.src, r.body, r.body_len = src, body, body and #body or len
    -- the engine's request span (zccp.core.transport)
    src.t0, src.traceparent, src.tracestate = r.t0, ngx_var.http_traceparent, ngx_var.http_tracestate
    local flags = kind and 0 or cache_flags()
    if r.api == "openai" then
        flags = flags + abi.C.ZCCP_FLAG_API_OPENAI
    end
    r.flags = flags
    if kind then
        r.extra = { kind = abi.C[r.kind_name] }
    end
    if run("prepare", r) == DONE or run("keys", r) == DONE or run("route", r) == DONE then
        return nil
    end
    return r
end

-- The requests in progress, by their nginx request's address (the abort handler runs in
-- its own light thread of the same request): one handler for every request instead of a
-- closure per request (creating one stops LuaJIT's trace). Keyed by the address as a
-- number, not by get_request()'s cdata: each call boxes a new cdata, and a table keys a
-- cdata by its identity, so the handler never found its request. Weak values: an entry
-- goes with its request's state.
local live = setmetatable({}, { __mode = "v" })
local function request_key()
    local key = tonumber(ffi_cast("uintptr_t", get_request()))   -- no tail call: docs/plugins.md
    return key
end
local function on_abort()
    local state = live[request_key()]
    if state then
        state.aborted = true
    end
end

-- serve()'s work once r is in ngx.ctx: the core's checks, the plugin phases, the engines.
local function serve_request(r, state, api, kind, s)
    local admitted, len = admit(api, kind, s)
    if not admitted then
        return
    end
    if run("access", r) == DONE then   -- the API key: 401 before the body
        return
    end
    if not prepare(r, s, len) then
        return
    end
    -- Registered only for the engine's wait (zccp.core.relay reads state.aborted), not before:
    -- ngx.on_abort makes a coroutine per call (a cost an L1 hit need not pay), and a
    -- client gone while nothing is claimed yet (the body, the plugins' Redis calls) has the
    -- Lua module end the request there, its log phase still run (lua_check_client_abort).
    live[request_key()] = state
    ngx_on_abort(on_abort)
    watch_client()   -- the body read may have left nginx's block_reading (zccp.core.client_gone)
    return core.attempts(r, state)
end

-- Content handler for POST /v1/messages ("anthropic") and /v1/chat/completions ("openai");
-- kind: "purge" or "warmup" (admin listener), "count_tokens" or "models" (GET);
-- endpoint: "completions" or "responses" (api "openai": /v1/completions, /v1/responses).
function _M.serve(api, kind, endpoint)
    local t0 = mono_s()   -- nginx's phase timings (zccp.lib.metrics.phase)
    local s = settings.get()
    local rid = ngx_var.zccp_caller_id   -- the caller's valid X-Request-ID, or ""
    if rid == "" then
        rid = new_request_id()
    end
    ngx_header["X-Request-ID"] = rid   -- $zccp_request_id (the log, error answers) is this header
    local kind_name = kind and (ADMIN_KINDS[kind] or MODEL_KINDS[kind]
                                or error("zccp.handler.serve: unknown kind " .. kind, 2))
    if endpoint and not ENDPOINTS[endpoint] then
        error("zccp.handler.serve: unknown endpoint " .. endpoint, 2)
    end
    -- r: the request's one home, for every phase (the log and response phases find it in
    -- ngx.ctx.zccp); r.state is the transport's part (the abort flag, the slot held).
    local state = { aborted = false, request_id = rid }
    local r = setmetatable({ api = api, kind = kind, kind_name = kind_name, endpoint = endpoint, request_id = rid,
                             admin = ADMIN_KINDS[kind or ""] ~= nil, state = state, t0 = t0 }, R_MT)
    ngx.ctx.zccp = r
    local ok, err = xpcall(serve_request, traceback, r, state, api, kind, s)
    if not ok then
        -- Answered here, not by nginx's error_page: its redirect to @zccp_error_* starts the
        -- request over with an empty ngx.ctx, so this location's log phase (the plugins'
        -- settle: limits' reservation, the usage record) would never see r.
        ngx_log(ngx_ERR, "zccp: request ", rid, " failed in the gateway: ", err)
        if not ngx.headers_sent then
            return errors.send(api, 500, "api_error", "internal error in the gateway")
        end
        return ngx.exit(ngx.ERROR)   -- mid-answer: the connection ends; the log phase still runs
    end
end

-- log_by_lua of the API locations: the plugins' log phase (api nil: no request metrics);
-- header_filter_by_lua: their response phase, for every answer.
_M.log, _M.response = pipeline.log, pipeline.response

-- The answers beside serve (zccp.core.edges): nginx's own refusals, 404s, models, L1 purge.
_M.too_large, _M.request_error, _M.not_found = edges.too_large, edges.request_error, edges.not_found
_M.purge_l1, _M.model_id, _M.nginx_error = edges.purge_l1, edges.model_id, edges.nginx_error
function _M.serve_models()
    local api = edges.models_api()
    if api then
        return _M.serve(api, "models")
    end
end

return _M
