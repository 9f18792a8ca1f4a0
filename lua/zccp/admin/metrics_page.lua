-- GET /metrics on the admin listener: nginx's counters (zccp.lib.metrics, in a shared dict)
-- followed by the engine's (read from its metrics socket), one scrape for both. A scraper
-- that prefers OpenMetrics (Prometheus does) gets it, with the engine's exemplars; any
-- other gets the text format 0.0.4.
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
local str_find = string.find
local str_lower = string.lower
local str_gsub = string.gsub
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

local TEXT_TYPE = "text/plain; version=0.0.4"
local OM_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"

-- Whether the Accept header ranks OpenMetrics at least as high as the text format (its
-- q values; a missing Accept, or one naming neither, is the text format).
local function wants_openmetrics(accept)
    if type(accept) ~= "string" then
        return false
    end
    local om, text = -1, -1
    for part in gmatch(str_lower(accept), "[^,]+") do
        local q = tonumber(str_match(part, ";%s*q%s*=%s*([%d.]+)")) or 1
        if str_find(part, "application/openmetrics-text", 1, true) then
            om = q > om and q or om
        elseif str_find(part, "text/plain", 1, true) or str_find(part, "*/*", 1, true) then
            text = q > text and q or text
        end
    end
    return om > 0 and om >= text
end

-- # HELP and # TYPE of family `name`: OpenMetrics names a counter's family without its
-- `_total` (its samples keep it) and escapes the help's backslashes and quotes.
local function head(name, kind, help, om)
    if om then
        if kind == "counter" then
            name = str_gsub(name, "_total$", "")
        end
        help = str_gsub(help, '[\\"]', "\\%0")
    end
    return "# HELP " .. name .. " " .. help .. "\n# TYPE " .. name .. " " .. kind
end

-- A bucket's bound: %g in the text format; OpenMetrics' canonical float (1.0, not 1).
local function le_of(bound, om)
    local le = str_format("%g", bound)
    if om and not str_find(le, "[.e]") then
        le = le .. ".0"
    end
    return le
end

-- The phase histogram's samples from the dict's keys (PHASE .. api .. phase .. bucket).
local function render_phases(d, keys, om)
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
    local out = { head(PHASE, "histogram", "nginx's own time per phase of a request, by API and phase: admit "
                  .. "(entry to the ring), engine (ring to the relay's end), total (start to the log phase)", om) }
    for _, id in ipairs(names) do
        local s = series[id]
        local labels = 'api="' .. s.api .. '",phase="' .. s.phase .. '"'
        local running = 0
        for i = 1, NB + 1 do
            running = running + (s.counts[i] or 0)
            local le = i <= NB and le_of(PHASE_BOUNDS[i], om) or "+Inf"
            out[#out + 1] = str_format('%s_bucket{%s,le="%s"} %d', PHASE, labels, le, running)
        end
        out[#out + 1] = str_format("%s_sum{%s} %.9g", PHASE, labels, s.sum)
        out[#out + 1] = str_format("%s_count{%s} %d", PHASE, labels, running)
    end
    return concat(out, "\n") .. "\n"
end

local function render_own(om)
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
    local phases = render_phases(d, keys, om)
    local out, n, seen = {}, 0, {}
    for _, key in ipairs(keys) do
        local name, api, status = str_match(key, "^([^\1]+)\1([^\1]*)\1?([^\1]*)$")
        if name then
            if not seen[name] then
                seen[name] = true
                n = n + 1
                out[n] = head(name, "counter", HELP[name] or name, om)
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

-- Engine e's metrics: its first line asks for the format (zccp.observe.metrics.MetricsServer).
local function engine_text(e, om)
    local s = settings.get()
    local sock = ngx_socket_tcp()
    sock:settimeouts(s.connect_timeout_ms, s.connect_timeout_ms, s.connect_timeout_ms)
    local ok, err = sock:connect("unix:" .. e.socket_path .. ".metrics")
    if not ok then
        return nil, err
    end
    ok, err = sock:send(om and "openmetrics\n" or "text\n")
    if not ok then
        sock:close()
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
    local om = wants_openmetrics(ngx.var.http_accept)
    ngx.header["Content-Type"] = om and OM_TYPE or TEXT_TYPE
    ngx.print(config_errors())
    local list = engines.list()
    if not engines.multi() then
        local text, err = engine_text(list[1], om)
        ngx.print(render_own(om),
            "# HELP zccp_engine_up Whether the engine answered the metrics scrape\n",
            "# TYPE zccp_engine_up gauge\nzccp_engine_up ", text and 1 or 0, "\n")
        if text then
            ngx.print(text)
        else
            ngx.log(ngx.WARN, "zccp: engine metrics unavailable: ", err)
        end
        if om then
            ngx.print("# EOF\n")
        end
        return
    end
    local out = { render_own(om):sub(1, -2),   -- its last newline: concat's (no blank line in OpenMetrics)
        "# HELP zccp_engine_up Whether the engine answered the metrics scrape, by engine",
        "# TYPE zccp_engine_up gauge" }
    local texts = {}
    for _, e in ipairs(list) do
        local text, err = engine_text(e, om)
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
    ngx.print(concat(out, "\n"), om and "\n# EOF\n" or "\n")
end

return _M
