-- GET /metrics on the admin listener: nginx's counters (zccp.lib.metrics, in a shared dict)
-- followed by the engine's (read from its metrics socket), one scrape for both.
local metrics = require "zccp.lib.metrics"
local engines = require "zccp.lib.engines"
local settings = require "zccp.settings"

local ngx = ngx
local ngx_socket_tcp = ngx.socket.tcp
local concat = table.concat
local sort = table.sort
local tonumber = tonumber
local ipairs = ipairs
local str_format = string.format
local str_match = string.match
local gmatch = string.gmatch
local byte = string.byte
local unpack = unpack

local _M = {}

local SEP, HELP, FIRST, LABEL, ROUTED, SEEDS = metrics.SEP, metrics.HELP, metrics.FIRST, metrics.LABEL,
    metrics.ROUTED, metrics.SEEDS
local PHASE, PHASE_BOUNDS = metrics.PHASE, metrics.PHASE_BOUNDS
local NB = #PHASE_BOUNDS

local function dict()
    return ngx.shared[metrics.DICT]
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
    metrics.flush_pending()
    ngx.sleep(metrics.SCRAPE_WAIT_S)   -- the other workers' sums (zccp.lib.metrics: BATCH_S)
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
