-- nginx-side counters in a lua_shared_dict; GET /metrics (zccp.admin.metrics_page) renders
-- them followed by the engine's, one scrape for both.
local ngx = ngx
local ngx_now = ngx.now
local ngx_req = ngx.req
local tonumber = tonumber
local ipairs = ipairs
local pairs = pairs
local jit = jit

local _M = { _VERSION = "0.1.0" }

local DICT = "zccp_metrics"
local SEP = "\1"

local HELP = {
    zccp_nginx_requests_total = "Responses sent by ZCCP's nginx locations, by API and status",
    zccp_nginx_bytes_in_total = "Request bytes received on ZCCP's locations",
    zccp_nginx_l1_total = "nginx's L1 cache (cache.l1), by API and result: hit, miss, store",
    zccp_nginx_auth_total = "API key checks (auth.mode keys), by API and result: ok, unauthenticated, "
        .. "model_refused, store_error",
    zccp_nginx_limited_total = "Requests refused 429 by a key's or tenant's limit, by API and limit",
    zccp_nginx_metered_tokens_total = "Tokens metered for requests with a key, by API and kind: input, output "
        .. "(the engine's exact counts), saved (what cache hits did not cost)",
    zccp_nginx_streams_ended_total = "Streams nginx ended before the answer did, by API and reason: "
        .. "stalled (the client read nothing for limits.stream_stall_timeout_ms), duration "
        .. "(limits.stream_max_duration_ms), bytes (limits.stream_max_bytes_kb)",
    zccp_nginx_engine_routed_total = "Requests an engine of engines: took (zccp.plugins.router.route), by engine",
    zccp_nginx_engine_spilled_total = "Requests an engine took because their preferred replica was past "
        .. "routing.spill_load, by engine",
    zccp_nginx_engine_failed_over_total = "Requests an engine took because a replica ranked above it was down "
        .. "or failed before answering, by engine",
    zccp_nginx_plugin_errors_total = "Requests a plugin raised an error on (answered 500), by plugin",
    zccp_nginx_l1_spans_dropped_total = "Spans of L1 hits nginx dropped while tracing, by reason: buffer_full "
        .. "(the worker's batch was full), not_sent (no slot free, or the engine did not answer the batch)",
}
-- Series whose first label is not api.
local FIRST = { zccp_nginx_engine_routed_total = "engine", zccp_nginx_engine_spilled_total = "engine",
                zccp_nginx_engine_failed_over_total = "engine",
                zccp_nginx_plugin_errors_total = "plugin", zccp_nginx_l1_spans_dropped_total = "reason" }
local ROUTED = { "zccp_nginx_engine_routed_total", "zccp_nginx_engine_spilled_total",
                 "zccp_nginx_engine_failed_over_total" }
-- The second label of a series (the first is api): status unless named here. Every label
-- value is from a fixed set (never a key or a tenant): bounded cardinality; per key and
-- per tenant usage is `zccp-keys usage` (docs/keys.md).
local LABEL = { zccp_nginx_l1_total = "result", zccp_nginx_auth_total = "result",
                zccp_nginx_limited_total = "limit", zccp_nginx_metered_tokens_total = "kind",
                zccp_nginx_streams_ended_total = "reason" }
-- The reasons zccp_nginx_streams_ended_total counts.
local STREAM_END_REASONS = { "stalled", "duration", "bytes" }

local function dict()
    return ngx.shared[DICT]
end

-- The dict key of series `name` {api, <its label>=value} (value nil: {api} alone): made
-- once (every label value is from a fixed set), not concatenated on every request.
local KEYS = {}

local function key_of(name, api, value)
    local by_api = KEYS[name]
    if not by_api then
        by_api = {}
        KEYS[name] = by_api
    end
    local by_value = by_api[api]
    if not by_value then
        by_value = {}
        by_api[api] = by_value
    end
    local k = by_value[value or ""]
    if not k then
        k = value == nil and name .. SEP .. api or name .. SEP .. api .. SEP .. value
        by_value[value or ""] = k
    end
    return k
end

-- zccp.plugins.auth.keys / zccp.plugins.limits.admit: add n (default 1) to series `name` {api, <its label>=value}.
function _M.count(name, api, value, n)
    local d = dict()
    if d and n ~= 0 then
        d:incr(key_of(name, api, value), n or 1, 0)
    end
end

-- Counts of every request (responses, bytes in, L1 results, keys checked, tokens metered)
-- are summed in this worker and added to the shared dict every BATCH_S (and when the
-- worker exits): one dict write per series per BATCH_S, not one per request (each is a
-- lock of the dict's mutex). A scrape waits SCRAPE_WAIT_S first (serve): every worker's
-- timer has run by then, so the scrape counts every request answered before it began.
local BATCH_S = 0.05
local SCRAPE_WAIT_S = 2 * BATCH_S
local pending = {}     -- dict key -> what this worker has not added yet
local batching = false

local function flush_pending()
    local d = dict()
    for k, n in pairs(pending) do
        pending[k] = nil
        if d then
            d:incr(k, n, 0)
        end
    end
end
-- Interpreted: it runs 20 times a second, so compiling it gains nothing, and LuaJIT's
-- traces rooted at its entry stop at the loop ("inner loop in root trace"), an abort it
-- retried every few seconds for as long as the worker lived (bench.jit_paths --steady).
jit.off(flush_pending)

-- Adds n to dict key k, summed in this worker first (see BATCH_S).
local function add_key(k, n)
    if not batching then
        local ok, err = ngx.timer.every(BATCH_S, flush_pending)
        if not ok then
            ngx.log(ngx.ERR, "zccp: metrics batch timer: ", err)
            local d = dict()
            if d then
                d:incr(k, n, 0)
            end
            return
        end
        batching = true
    end
    pending[k] = (pending[k] or 0) + n
end

-- Like count(), summed in this worker first (see BATCH_S).
local function add(name, api, value, n)
    n = n or 1
    if n == 0 then
        return
    end
    add_key(key_of(name, api, value), n)
end

-- nginx's time per phase, a histogram (zccp_nginx_phase_seconds{api, phase}): "admit" (the
-- handler's entry to the ring: body, plugins, fingerprint, L1 lookup, claim, fill), "engine"
-- (the ring to the relay's end: the engine's answer and its copy to the client), "total"
-- (the request's start to its log phase; ngx.now()'s ms resolution). Each bucket is a dict
-- key (not cumulative; render adds them up), summed in the worker like the counters.
local PHASE = "zccp_nginx_phase_seconds"
local PHASE_BOUNDS = { 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                       0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10 }
local NB = #PHASE_BOUNDS
local HKEYS = {}   -- api -> phase -> { bucket keys 1..NB+1, then the sum's key }

local function phase_keys(api, phase)
    local by_api = HKEYS[api]
    if not by_api then
        by_api = {}
        HKEYS[api] = by_api
    end
    local ks = by_api[phase]
    if not ks then
        ks = {}
        local base = PHASE .. SEP .. api .. SEP .. phase .. SEP
        for i = 1, NB + 1 do
            ks[i] = base .. i
        end
        ks[NB + 2] = base .. "sum"
        by_api[phase] = ks
    end
    return ks
end

function _M.phase(api, phase, seconds)
    local ks = phase_keys(api, phase)
    local i = 1
    while i <= NB and seconds > PHASE_BOUNDS[i] do
        i = i + 1
    end
    add_key(ks[i], 1)
    add_key(ks[NB + 2], seconds)
end

_M.add = add

-- log_by_lua: one count per response, whoever answered it (Lua, error_page, engine);
-- summed in the worker (add): no shared-dict write per request.
function _M.log(api)
    add("zccp_nginx_requests_total", api, ngx.status)
    add("zccp_nginx_bytes_in_total", api, nil, tonumber(ngx.var.request_length) or 0)
    _M.phase(api, "total", ngx_now() - ngx_req.start_time())
end

-- zccp.plugins.l1.cache: one lookup's or one store's result ("hit", "miss", "store"), summed in the worker.
function _M.l1(api, result)
    add("zccp_nginx_l1_total", api, result)
end

-- zccp.handler: a stream nginx ended for `reason` (one of STREAM_END_REASONS).
function _M.stream_ended(api, reason)
    local d = dict()
    if d then
        d:incr("zccp_nginx_streams_ended_total" .. SEP .. api .. SEP .. reason, 1, 0)
    end
end

-- zccp.handler: engine `name` took a request (several engines: zccp.plugins.router.route), spilled to it
-- for load or failed over to it.
function _M.routed(name, spilled, failed_over)
    local d = dict()
    if not d then
        return
    end
    d:incr(ROUTED[1] .. SEP .. name, 1, 0)
    if spilled then
        d:incr(ROUTED[2] .. SEP .. name, 1, 0)
    end
    if failed_over then
        d:incr(ROUTED[3] .. SEP .. name, 1, 0)
    end
end

-- A plugin raised (zccp.core.pipeline): counted by its name, a bounded set (the chain).
function _M.plugin_error(name)
    local d = dict()
    if d then
        d:incr("zccp_nginx_plugin_errors_total" .. SEP .. name, 1, 0)
    end
end

-- zccp.plugins.l1.spans: n spans of L1 hits dropped for `reason` ("buffer_full", "not_sent").
function _M.l1_spans_dropped(reason, n)
    local d = dict()
    if d then
        d:incr("zccp_nginx_l1_spans_dropped_total" .. SEP .. reason, n, 0)
    end
end

-- Series that exist from the start, at 0, so that a rate over them misses nothing.
local SEEDS = {
    "zccp_nginx_requests_total" .. SEP .. "anthropic" .. SEP .. "200",
    "zccp_nginx_requests_total" .. SEP .. "openai" .. SEP .. "200",
    "zccp_nginx_bytes_in_total" .. SEP .. "anthropic",
    "zccp_nginx_bytes_in_total" .. SEP .. "openai",
}
for _, reason in ipairs { "buffer_full", "not_sent" } do
    SEEDS[#SEEDS + 1] = "zccp_nginx_l1_spans_dropped_total" .. SEP .. reason
end
for _, api in ipairs { "anthropic", "openai" } do
    for _, result in ipairs { "hit", "miss", "store" } do
        SEEDS[#SEEDS + 1] = "zccp_nginx_l1_total" .. SEP .. api .. SEP .. result
    end
    for _, reason in ipairs(STREAM_END_REASONS) do
        SEEDS[#SEEDS + 1] = "zccp_nginx_streams_ended_total" .. SEP .. api .. SEP .. reason
    end
end

-- What the /metrics page (zccp.admin.metrics_page) renders these counters with.
_M.DICT, _M.SEP, _M.HELP, _M.FIRST, _M.LABEL, _M.ROUTED, _M.SEEDS = DICT, SEP, HELP, FIRST, LABEL, ROUTED, SEEDS
_M.PHASE, _M.PHASE_BOUNDS, _M.SCRAPE_WAIT_S, _M.flush_pending = PHASE, PHASE_BOUNDS, SCRAPE_WAIT_S, flush_pending

-- GET /metrics (nginx/zccp_admin.conf): zccp.admin.metrics_page.
function _M.serve()
    return require("zccp.admin.metrics_page").serve()
end

return _M
