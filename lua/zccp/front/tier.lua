-- The front tier (docs/scale-out.md, "The front tier"): one nginx in front of several
-- complete ZCCP hosts sends each conversation to the host most likely to hold its prefix
-- in KV cache. route() (access phase) reads the body and computes the route key with
-- ZCCP's own fingerprint; balance() (balancer_by_lua) ranks the hosts for that key by
-- rendezvous hashing (zccp.lib.rendezvous) and tries them best first: a host whose connection
-- fails is skipped for `down_s` by every worker, and the request goes to the next one.
--
-- The route key, in order:
--   1. the fingerprint's route key (r.route_key: stable across a conversation's turns,
--      the same key zccp.plugins.router.route uses between engine replicas);
--   2. other bodies (/v1/responses, /v1/completions, over the 64 KiB decode limit, not
--      JSON, numbers beyond 2^53): fp.route_key (/v1/responses: the same conversation
--      rule; else the body's first FALLBACK_BYTES bytes without "stream"/"stream_options":
--      an SDK writes a conversation's start the same way every turn);
--   3. no body (GET /v1/models, /health of a host): the request id, i.e. anywhere.
local fp = require "zccp.fp.fingerprint"
local hosts = require "zccp.front.hosts"
local errors = require "zccp.errors"
local balancer = require "ngx.balancer"
local cjson = require "cjson.safe"

local ngx = ngx
local ngx_var = ngx.var
local log = ngx.log
local ERR, WARN = ngx.ERR, ngx.WARN
local min = math.min

local _M = { _VERSION = "0.1.0" }

local FALLBACK_BYTES = fp.ROUTE_RAW_BYTES
-- bodies keys() does not take: fp.route_key (a /v1/responses conversation keeps its host)
local ENDPOINTS = { ["/v1/responses"] = "responses", ["/v1/completions"] = "completions" }
_M.FALLBACK_BYTES = FALLBACK_BYTES

local APIS = {
    ["/v1/messages"] = "anthropic",
    ["/v1/messages/count_tokens"] = "anthropic",
    ["/v1/chat/completions"] = "openai",
}

-- The error shape of a path: OpenAI's for its endpoints (/v1/completions and /v1/responses
-- route by the body's first bytes: nginx has no fingerprint for them), Anthropic's otherwise.
local OPENAI_PATHS = { ["/v1/chat/completions"] = true, ["/v1/completions"] = true, ["/v1/responses"] = true }

local function shape_of(uri)
    return OPENAI_PATHS[uri] and "openai" or "anthropic"
end

local opts          -- init()'s: port, tries, down_s, dict
local dict

-- init_by_lua: the masks load here, in the master, so that every worker inherits them
-- compiled (the fingerprint masks before it hashes; zccp/mask_patterns.lua on the
-- package path, the hosts' file in deploy/k8s/front.yaml).
function _M.init(o)
    opts = o
    dict = ngx.shared[o.dict]
    require("zccp.fp.mask_store").init({ write_last_good = false })
    require("zccp.fp.mask_apply")   -- zccp.fp.fingerprint requires it lazily: load it in the master
    hosts.init(o)
end

function _M.init_worker()
    math.randomseed(ngx.now() * 1000 + ngx.worker.pid())   -- DNS message ids
    hosts.init_worker()
end


-- The route key of a request to `uri` with `body` (nil: none), and where it came from
-- ("fingerprint", "body" or "none").
function _M.key_of(uri, body)
    local api = APIS[uri]
    if body then
        if api then
            local r = fp.keys(api, body)
            if r then
                return r.route_key, "fingerprint"
            end
        end
        return fp.route_key(api or "openai", body, ENDPOINTS[uri]), "body"
    end
    return nil, "none"
end

local function unavailable(message)
    local api = shape_of(ngx_var.uri)
    ngx.header["Retry-After"] = "1"
    errors.send(api, 503, "overloaded_error", message)
    return ngx.exit(503)
end

-- access_by_lua: the route key into ngx.ctx, and the hosts' ring as it is now (a retry
-- ranks the same hosts even if the list changes meanwhile).
function _M.route()
    local ring, addrs = hosts.current()
    if not ring then
        return unavailable("no ZCCP host is known yet")
    end
    local body
    if ngx.req.get_method() ~= "GET" then
        ngx.req.read_body()
        body = ngx.req.get_body_data()   -- in memory: client_body_buffer_size = the body limit
    end
    local key, how = _M.key_of(ngx_var.uri, body)
    local ctx = ngx.ctx
    ctx.front_key = key or ngx_var.request_id
    ctx.front_ring, ctx.front_addrs = ring, addrs
    ngx_var.zccp_route = how
end

local function up(addrs)
    return function(i)
        return not dict:get("down:" .. addrs[i])
    end
end

-- The host index for a request's first try: the best for `key` not marked down (the
-- best of all when every one is).
function _M.first_pick(ring, addrs, key)
    return ring:pick(key, up(addrs)) or ring:pick(key)
end

-- balancer_by_lua: the best host for the key that is not marked down; after a failure,
-- the next in rank not yet tried (a host marked down only when all others were tried).
function _M.balance()
    local ctx = ngx.ctx
    local ring, addrs, key = ctx.front_ring, ctx.front_addrs, ctx.front_key
    local tried = ctx.front_tried
    local pick
    if not tried then
        pick = _M.first_pick(ring, addrs, key)
        tried = {}
        ctx.front_tried = tried
        local more = min(ring.n, opts.tries) - 1
        if more > 0 then
            balancer.set_more_tries(more)
        end
    else
        -- a host that answered 503 is up (its engine is restarting, or it is full): tried
        -- elsewhere, never marked down; 502 and 504 are nginx's own for a connect error,
        -- a reset or a timeout (and a host's 502/504, which mean the same)
        local state, code = balancer.get_last_failure()
        local last = ctx.front_last
        if state == "failed" and code ~= 503 and opts.down_s > 0 then
            dict:set("down:" .. addrs[last], true, opts.down_s)
            log(WARN, "zccp front: host ", addrs[last], " failed; skipped for ", opts.down_s, " s")
        end
        local order, spare = ring:rank(key), nil
        local is_up = up(addrs)
        for j = 1, #order do
            local i = order[j]
            if not tried[i] then
                if is_up(i) then
                    pick = i
                    break
                end
                spare = spare or i
            end
        end
        -- every host tried cannot happen (tries <= hosts, set_more_tries above); were it
        -- to, the best again, never the upstream block's placeholder
        pick = pick or spare or order[1]
    end
    tried[pick] = true
    ctx.front_last = pick
    local ok, err = balancer.set_current_peer(addrs[pick], opts.port)
    if not ok then
        log(ERR, "zccp front: set_current_peer ", addrs[pick], ": ", err)
    end
end

-- error_page target for nginx's own failures (no host answered, body too large), in
-- the shape of the API the path names.
function _M.failed(status)
    local api = shape_of(ngx_var.uri)
    if status == 413 then
        return errors.send(api, 413, "request_too_large",
            "request body exceeds the limit of " .. opts.max_body .. " bytes")
    end
    ngx.header["Retry-After"] = "1"
    return errors.send(api, 503, "overloaded_error", "no ZCCP host answered")
end

-- GET /health on the front: 200 while it knows at least one host, with the list.
function _M.health()
    local list, at, err = hosts.state()
    ngx.status = list and 200 or 503
    ngx.header["Content-Type"] = "application/json"
    ngx.say(cjson.encode({ status = list and "ok" or "no hosts", hosts = list or "",
                           resolved_at = at or cjson.null, last_error = err or cjson.null }))
end

return _M
