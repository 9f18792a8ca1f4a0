-- nginx-side counters in a lua_shared_dict, and GET /metrics: these counters
-- followed by the engine's (read from its metrics socket), one scrape for both.
local engines = require "zccp.lib.engines"

local ngx = ngx
local ngx_socket_tcp = ngx.socket.tcp
local ngx_now = ngx.now
local ngx_req = ngx.req
local concat = table.concat
local sort = table.sort
local tonumber = tonumber
local ipairs = ipairs
local pairs = pairs
local str_format = string.format
local str_match = string.match
local gmatch = string.gmatch
local byte = string.byte
local unpack = unpack
local jit = jit
local settings = require "zccp.settings"

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
}
-- Series whose first label is not api.
local FIRST = { zccp_nginx_engine_routed_total = "engine", zccp_nginx_engine_spilled_total = "engine",
                zccp_nginx_engine_failed_over_total = "engine",
                zccp_nginx_plugin_errors_total = "plugin" }
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

-- Series that exist from the start, at 0, so that a rate over them misses nothing.
local SEEDS = {
    "zccp_nginx_requests_total" .. SEP .. "anthropic" .. SEP .. "200",
    "zccp_nginx_requests_total" .. SEP .. "openai" .. SEP .. "200",
    "zccp_nginx_bytes_in_total" .. SEP .. "anthropic",
    "zccp_nginx_bytes_in_total" .. SEP .. "openai",
}
for _, api in ipairs { "anthropic", "openai" } do
    for _, result in ipairs { "hit", "miss", "store" } do
        SEEDS[#SEEDS + 1] = "zccp_nginx_l1_total" .. SEP .. api .. SEP .. result
    end
    for _, reason in ipairs(STREAM_END_REASONS) do
        SEEDS[#SEEDS + 1] = "zccp_nginx_streams_ended_total" .. SEP .. api .. SEP .. reason
    end
end

-- The phase histogram's samples from the dict's keys (PHASE .. api .. phase .. bucket).
local function render_phases(d, keys)
    local series, names = {}, {}
    for _, key in ipairs(keys) do
        local api, phase, idx = str_match(key, "^" .. PHASE .. "\1([^\1]*)\1([^\1]*)\1([^\1]*)$")
        if api then
            local id = api .. SEP .. phase
            local s = series[id]
            if not s then
                s = { api = api, phase = phase, counts = {}, sum = 0 }
                series[id] = s
                names[#names + 1] = id
            end
            if idx == "sum" then
                s.sum = d:get(key) or 0
            else
                s.counts[tonumber(idx) or 0] = d:get(key) or 0
            end
        end
    end
    if #names == 0 then
        return ""
    end
    sort(names)
    local out = { "# HELP " .. PHASE .. " nginx's own time per phase of a request, by API and phase: admit "
                  .. "(entry to the ring), engine (ring to the relay's end), total (start to the log phase)",
                  "# TYPE " .. PHASE .. " histogram" }
    for _, id in ipairs(names) do
        local s = series[id]
        local labels = 'api="' .. s.api .. '",phase="' .. s.phase .. '"'
        local running = 0
        for i = 1, NB + 1 do
            running = running + (s.counts[i] or 0)
            local le = i <= NB and str_format("%g", PHASE_BOUNDS[i]) or "+Inf"
            out[#out + 1] = str_format('%s_bucket{%s,le="%s"} %d', PHASE, labels, le, running)
        end
        out[#out + 1] = str_format("%s_sum{%s} %.9g", PHASE, labels, s.sum)
        out[#out + 1] = str_format("%s_count{%s} %d", PHASE, labels, running)
    end
    return concat(out, "\n") .. "\n"
end

local function render_own()
    local d = dict()
    if not d then
        return ""
    end
    local keys = d:get_keys(0)
    local have = {}
    for _, key in ipairs(keys) do
        have[key] = true
    end
    local seeds = SEEDS
    if engines.multi() then   -- every engine's routing series, at 0 until it takes a request
        seeds = { unpack(SEEDS) }
        for _, e in ipairs(engines.list()) do
            for _, name in ipairs(ROUTED) do
                seeds[#seeds + 1] = name .. SEP .. e.name
            end
        end
    end
    for _, key in ipairs(seeds) do
        if not have[key] then
            keys[#keys + 1] = key
        end
    end
    sort(keys)
    local phases = render_phases(d, keys)
    local out, n, seen = {}, 0, {}
    for _, key in ipairs(keys) do
        local name, api, status = str_match(key, "^([^\1]+)\1([^\1]*)\1?([^\1]*)$")
        if name then
            if not seen[name] then
                seen[name] = true
                n = n + 1
                out[n] = "# HELP " .. name .. " " .. (HELP[name] or name) .. "\n# TYPE " .. name .. " counter"
            end
            local labels = (FIRST[name] or "api") .. '="' .. api .. '"'
            if status ~= "" then
                labels = labels .. ',' .. (LABEL[name] or "status") .. '="' .. status .. '"'
            end
            n = n + 1
            out[n] = str_format("%s{%s} %d", name, labels, d:get(key) or 0)
        end
    end
    return concat(out, "\n") .. "\n" .. phases
end

local function engine_text(e)
    local s = settings.get()
    local sock = ngx_socket_tcp()
    sock:settimeouts(s.connect_timeout_ms, s.connect_timeout_ms, s.connect_timeout_ms)
    local ok, err = sock:connect("unix:" .. e.socket_path .. ".metrics")
    if not ok then
        return nil, err
    end
    local data, rerr, partial = sock:receive("*a")
    sock:close()
    if not data then
        return nil, rerr or "read failed", partial
    end
    return data
end

-- An engine's exposition with engine="<name>" added to every sample, gathered into
-- `fams` (family name -> { its # lines, its samples }; `order`: the families in first-seen
-- order): several engines, one valid scrape, each family's lines in one group.
local function gather(text, name, fams, order)
    local label = 'engine="' .. name .. '"'
    local fam
    for line in gmatch(text, "[^\n]+") do
        if byte(line, 1) == 35 then   -- '#': # HELP <family> ... / # TYPE <family> ...
            local fname = str_match(line, "^# %u+ ([%w_:]+)")
            if fname then
                fam = fams[fname]
                if not fam then
                    fam = { head = {}, seen = {}, samples = {} }
                    fams[fname] = fam
                    order[#order + 1] = fname
                end
                if not fam.seen[line] then
                    fam.seen[line] = true
                    fam.head[#fam.head + 1] = line
                end
            end
        elseif fam then
            local metric, rest = str_match(line, "^([%w_:]+){(.*)$")
            if metric then
                fam.samples[#fam.samples + 1] = metric .. "{" .. label .. "," .. rest
            else
                metric, rest = str_match(line, "^([%w_:]+)(%s.*)$")
                if metric then
                    fam.samples[#fam.samples + 1] = metric .. "{" .. label .. "}" .. rest
                end
            end
        end
    end
end

-- What nginx refused at its last start or reload (every worker has the master's lists).
local function config_errors()
    local masks = #require("zccp.fp.mask_store").errors()
    local plugins = #require("zccp.core.pipeline").status().errors
    return "# HELP zccp_nginx_config_errors Mask patterns and plugins refused at nginx's last (re)load "
        .. "(their last good version, if any, in force; the error log names file and line)\n"
        .. "# TYPE zccp_nginx_config_errors gauge\n"
        .. 'zccp_nginx_config_errors{kind="mask"} ' .. masks .. "\n"
        .. 'zccp_nginx_config_errors{kind="plugin"} ' .. plugins .. "\n"
end

function _M.serve()
    if not require("zccp.admin.gate").allowed("anthropic") then   -- the admin listener only
        return
    end
    flush_pending()
    ngx.sleep(SCRAPE_WAIT_S)   -- the other workers' sums (see BATCH_S)
    ngx.header["Content-Type"] = "text/plain; version=0.0.4"
    ngx.print(config_errors())
    local list = engines.list()
    if not engines.multi() then
        local text, err = engine_text(list[1])
        ngx.print(render_own(),
            "# HELP zccp_engine_up Whether the engine answered the metrics scrape\n",
            "# TYPE zccp_engine_up gauge\nzccp_engine_up ", text and 1 or 0, "\n")
        if text then
            ngx.print(text)
        else
            ngx.log(ngx.WARN, "zccp: engine metrics unavailable: ", err)
        end
        return
    end
    local out = { render_own(),
        "# HELP zccp_engine_up Whether the engine answered the metrics scrape, by engine",
        "# TYPE zccp_engine_up gauge" }
    local texts = {}
    for _, e in ipairs(list) do
        local text, err = engine_text(e)
        texts[e.name] = text
        out[#out + 1] = 'zccp_engine_up{engine="' .. e.name .. '"} ' .. (text and 1 or 0)
        if not text then
            ngx.log(ngx.WARN, "zccp: engine ", e.name, " metrics unavailable: ", err)
        end
    end
    local fams, order = {}, {}
    for _, e in ipairs(list) do
        if texts[e.name] then
            gather(texts[e.name], e.name, fams, order)
        end
    end
    for _, fname in ipairs(order) do
        local fam = fams[fname]
        out[#out + 1] = concat(fam.head, "\n")
        if #fam.samples > 0 then
            out[#out + 1] = concat(fam.samples, "\n")
        end
    end
    ngx.print(concat(out, "\n"), "\n")
end

return _M
