-- `zccp-nginx check` and `zccp-stack reload`'s check (engine/zccp/ops/nginx_check.py): run
-- by init_by_lua of a throwaway nginx (the operator's own binary, no listener), so the mask
-- patterns are compiled by the PCRE and the plugins loaded by the LuaJIT that nginx will use.
-- Nothing is written but the report: no last-good file, no plugin copy kept in force. One
-- line per refusal, "file:line: why".
local ipairs = ipairs
local pairs = pairs
local pcall = pcall
local tostring = tostring
local io_open = io.open
local str_sub = string.sub
local str_gsub = string.gsub
local concat = table.concat

local _M = { _VERSION = "0.1.0" }

local str_match = string.match

local function starts(s, prefix)
    return str_sub(s, 1, #prefix) == prefix
end

-- "file:line: why" with the whole file name: Lua shortens a long chunk name to "...tail".
local function located(file, msg)
    local head, line, why = str_match(msg, "^(.-):(%d+): (.*)$")
    if head and starts(head, "...") and str_sub(file, -(#head - 3)) == str_sub(head, 4) then
        return file .. ":" .. line .. ": " .. why
    end
    return msg
end

-- opts: mask_patterns (file), plugins (settings.plugins as rendered, last_good an empty
-- scratch directory), settings (what a plugin may read while it loads), report (the file
-- to write).
function _M.run(opts)
    local out = {}
    require("zccp.settings").set(opts.settings)
    require("zccp.lib.abi").init(opts.settings.abi_header)   -- what the built-in plugins' modules read
    local mask_store = require "zccp.fp.mask_store"
    -- a last-good path that does not exist: a broken pattern is reported, not replaced
    local n, errs = mask_store.init({ path = opts.mask_patterns, last_good_path = opts.report .. ".none",
                                      write_last_good = false })
    for _, e in ipairs(errs) do
        local where = e.line and (e.file .. ":" .. e.line) or e.file
        local msg = located(e.file, (str_gsub(tostring(e.message), "[\r\n\t]", " ")))
        out[#out + 1] = starts(msg, e.file) and ("mask\t" .. msg) or
            ("mask\t" .. where .. ": pattern \"" .. tostring(e.name) .. "\": " .. msg)
    end
    out[#out + 1] = "masks\t" .. n
    local pipeline = require "zccp.core.pipeline"
    local ok, loaded, perrs = pcall(pipeline.init, opts.plugins)
    if not ok then   -- fails closed: the refusals it recorded by file, else why it raised (the order)
        perrs = pipeline.status().errors
        if #perrs == 0 then
            out[#out + 1] = "plugin\t" .. tostring(loaded)
        end
    end
    for _, e in ipairs(perrs or {}) do
        local file = tostring(e.file)
        local msg = located(file, (str_gsub(tostring(e.message), "[\r\n\t]", " ")))
        out[#out + 1] = "plugin\t" .. (starts(msg, file) and msg or (file .. ": plugin " .. tostring(e.plugin)
                                                                  .. ": " .. msg))
    end
    -- compiled: the chain's plugins less the refused (a raise builds no chain to count)
    out[#out + 1] = "plugins\t" .. (ok and #(loaded or {}) or math.max(0, #opts.plugins.chain - #perrs))
    local f = io_open(opts.report, "wb")
    if f then
        f:write(concat(out, "\n"), "\n")
        f:close()
    end
end

-- The options of a rendered init_by_lua (zccp.init's, `zccp-stack reload`): checked as
-- above, with the settings nginx would start with. dir: a scratch directory with an empty
-- last_good/ (the plugins' good copies go there, not over the ones in force).
function _M.run_rendered(opts, dir)
    local plugins = {}
    for k, v in pairs(opts.plugins) do
        plugins[k] = v
    end
    plugins.last_good = dir .. "/last_good"
    _M.run({ mask_patterns = opts.mask_patterns, report = dir .. "/report", plugins = plugins, settings = opts })
end

return _M
