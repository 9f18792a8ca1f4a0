-- The mask set in force (docs/fingerprint.md, "Masks"): loads the ordered list of PCRE
-- patterns and replacements from lua/zccp/mask_patterns.lua, compiles it, keeps the
-- last-good set and names the set by its digest. zccp.fp.mask_apply applies it (with
-- ngx.re.gsub(s, pattern, replacement, "jo")) to the prompt text before any cache key
-- or fingerprint is computed (never to what the model sees).
--
-- init(opts) runs in init_by_lua (the master, before the workers fork, so they
-- inherit the compiled patterns). A pattern that does not compile is logged by
-- name and listed by errors(); the pattern of the same name from the last-good
-- file (the set in force before, written here after every load) takes its place,
-- else it is dropped. So a broken edit followed by `zccp-stack reload` never takes
-- down the patterns already in force, even though reload recreates the Lua VM.
-- engine/zccp/cache/mask_store.py (load_masks) resolves the same files the same way.
local sha256 = require "zccp.lib.sha256"
local libc = require "zccp.lib.libc"

local ngx = ngx
local type = type
local ipairs = ipairs
local pcall = pcall
local error = error
local tostring = tostring
local loadstring = loadstring
local setfenv = setfenv
local io_open = io.open
local os_rename = os.rename
local os_remove = os.remove
local str_format = string.format
local str_find = string.find
local str_match = string.match
local str_gmatch = string.gmatch
local concat = table.concat
local package = package

local _M = { _VERSION = "0.1.0" }

local LAST_GOOD_MODE = 416   -- 0640 (owner rw, group r: the engine reads it)

local re_gsub = ngx and ngx.re and ngx.re.gsub
local re_find = ngx and ngx.re and ngx.re.find

-- Prefilters (an entry's optional `prefilter` list): regexes that every match of the
-- entry's pattern contains. When one of them finds nothing in a string, the pattern's
-- gsub cannot match there and is skipped: the same result, without a PCRE scan of the
-- whole string per pattern (most prompts contain no UUID, e-mail address, timestamp or
-- long number). Returns the ones that compile, or nil.
local function compile_prefilter(list)
    if type(list) ~= "table" or not re_find then
        return nil
    end
    local out = {}
    for _, r in ipairs(list) do
        if type(r) == "string" then
            local ok, _, _, err = pcall(re_find, "", r, "jo")
            if ok and not err then
                out[#out + 1] = r
            end
        end
    end
    return #out > 0 and out or nil
end

-- Every entry's first prefilter in one alternation: when it finds nothing in a string
-- (most strings), no entry can match, and the string costs one scan instead of one per
-- distinct prefilter. nil when some entry has none, or one refers to a group (its number
-- would point elsewhere inside the alternation), or the alternation does not compile.
local function any_prefilter(patterns, n)
    if n == 0 or not re_find then
        return nil
    end
    local firsts, seen = {}, {}
    for i = 1, n do
        local req = patterns[i].requires
        local rx = req and req[1]
        if not rx or str_find(rx, "\\[1-9gk]") or str_find(rx, "(?P", 1, true)
                or str_find(rx, "%(%?[0-9R&+-]") then
            return nil
        end
        if not seen[rx] then
            seen[rx] = true
            firsts[#firsts + 1] = "(?:" .. rx .. ")"
        end
    end
    local any = concat(firsts, "|")
    local ok, _, _, err = pcall(re_find, "", any, "jo")
    if not ok or err then
        return nil
    end
    return any
end

local state = {
    loaded = false,
    patterns = {},   -- { name, pattern, replacement, requires } in force, in order
    n = 0,
    any = nil,       -- every entry's first prefilter in one alternation (any_prefilter)
    errors = {},     -- { name = ..., message = ... }
    digest = nil,
    digest_raw = nil,
    path = nil,
    last_good_path = nil,
}

local function log(level, ...)
    if ngx and ngx.log then
        ngx.log(level, ...)
    end
end

local function default_path()
    local p = package.searchpath and package.searchpath("zccp.mask_patterns", package.path)
    return p
end

local function default_last_good(path)
    return (path:gsub("%.lua$", "")) .. ".last_good.lua"
end

local function read_file(path)
    local f, err = io_open(path, "rb")
    if not f then
        return nil, err
    end
    local s = f:read("*a")
    f:close()
    return s
end

-- Runs a data file in an empty environment; returns the list or nil, err.
local function load_list(path)
    local src, err = read_file(path)
    if not src then
        return nil, err
    end
    local f, perr = loadstring(src, "@" .. path)
    if not f then
        return nil, perr
    end
    setfenv(f, {})
    local ok, list = pcall(f)
    if not ok then
        return nil, tostring(list)
    end
    if type(list) ~= "table" then
        return nil, path .. ": expected `return { { name = ..., pattern = ..., replacement = ... }, ... }`"
    end
    return list
end

-- Compiles pattern and replacement template (into ngx.re's "o" cache): true or nil, err.
local function try_compile(pattern, replacement)
    if not re_gsub then
        return nil, "ngx.re is not available (zccp.fp.mask_store runs inside nginx)"
    end
    local ok, res, _, err = pcall(re_gsub, "", pattern, replacement, "jo")
    if not ok then
        return nil, tostring(res)
    end
    if res == nil then
        return nil, err or "cannot compile"
    end
    return true
end

local function digest_of(patterns, n)
    local parts = {}
    for i = 1, n do
        local p = patterns[i]
        parts[#parts + 1] = p.name .. "\0" .. p.pattern .. "\0" .. p.replacement .. "\0"
    end
    local s = concat(parts)
    local d = sha256.digest(s, #s)
    if not d then
        return nil
    end
    return sha256.hex(d, #d), d
end

local function write_last_good(path, patterns, n)
    local out = { "-- Written by zccp.fp.mask_store: the mask patterns last in force. Do not edit;\n",
                  "-- edit mask_patterns.lua instead.\nreturn {\n" }
    for i = 1, n do
        local p = patterns[i]
        local pf = {}
        for j, r in ipairs(p.requires or {}) do
            pf[j] = str_format("%q", r)
        end
        out[#out + 1] = str_format("    { name = %q, pattern = %q, replacement = %q, prefilter = { %s } },\n",
                                   p.name, p.pattern, p.replacement, concat(pf, ", "))
    end
    out[#out + 1] = "}\n"
    local tmp = path .. ".tmp"
    -- 0640 whatever the umask: the operator's patterns are nobody else's to read
    local ok, werr = libc.write_file(tmp, concat(out), LAST_GOOD_MODE)
    if not ok then
        os_remove(tmp)
        return nil, werr
    end
    local rok, rerr = os_rename(tmp, path)
    if not rok then
        os_remove(tmp)
        return nil, rerr
    end
    return true
end

-- The line of the patterns file where the entry `name` is named (name = "..."), or nil
-- (a file that does not load names its own line in its message).
local function line_of(path, name)
    local src = read_file(path)
    if not src then
        return nil
    end
    local line = 1
    for text in str_gmatch(src, "([^\n]*)\n?") do
        local q = str_match(text, "name%s*=%s*([\"'])")
        if q and str_find(text, q .. name .. q, 1, true) then
            return line
        end
        line = line + 1
        if line > 100000 then
            return nil
        end
    end
    return nil
end

-- opts: path (default: zccp/mask_patterns.lua on package.path), last_good_path
-- (default: <path without .lua>.last_good.lua), write_last_good (default: true in
-- the init phase). Returns the number of patterns in force and the list of errors.
function _M.init(opts)
    if opts ~= nil and type(opts) ~= "table" then
        error("zccp.fp.mask_store.init: opts must be a table", 2)
    end
    opts = opts or {}
    local path = opts.path or default_path()
    if not path then
        error("zccp.fp.mask_store.init: zccp/mask_patterns.lua not found on package.path", 2)
    end
    local lg_path = opts.last_good_path or default_last_good(path)
    local write = opts.write_last_good
    if write == nil then
        write = (ngx and ngx.get_phase and ngx.get_phase() == "init") and true or false
    end

    local errors = {}
    local function report(name, msg)
        local line = line_of(path, name)
        local where = line and (path .. ":" .. line) or path
        errors[#errors + 1] = { name = name, message = msg, file = path, line = line }
        log(ngx and ngx.ERR, "zccp masks: ", where, ": pattern \"", name, "\" rejected: ", msg)
    end

    -- the previous good set
    local prev, prev_order = {}, {}
    local lg_file = io_open(lg_path, "rb")
    if lg_file then
        lg_file:close()
        local list, err = load_list(lg_path)
        if list then
            for _, e in ipairs(list) do
                if type(e) == "table" and type(e.name) == "string" and type(e.pattern) == "string"
                   and type(e.replacement) == "string" and not prev[e.name] then
                    prev[e.name] = e
                    prev_order[#prev_order + 1] = e
                end
            end
        else
            log(ngx and ngx.WARN, "zccp masks: cannot read the last-good file ", lg_path, ": ", err)
        end
    end

    local entries, ferr = load_list(path)
    if not entries then
        report(path, ferr)
        entries = prev_order
        prev = {}
    end

    local patterns, n, seen = {}, 0, {}
    for idx = 1, #entries do
        local e = entries[idx]
        local name = type(e) == "table" and e.name or nil
        if type(name) ~= "string" or name == "" then
            report("#" .. idx, "entry needs a non-empty string `name`")
        elseif seen[name] then
            report(name, "duplicate name")
        else
            seen[name] = true
            local pat, repl, pf = e.pattern, e.replacement, e.prefilter
            if repl == nil then
                repl = ""
            end
            local ok, err
            if type(pat) ~= "string" then
                err = "`pattern` must be a string"
            elseif type(repl) ~= "string" then
                err = "`replacement` must be a string"
            else
                ok, err = try_compile(pat, repl)
            end
            if not ok then
                report(name, err)
                local p = prev[name]
                if p and try_compile(p.pattern, p.replacement) then
                    log(ngx and ngx.WARN, "zccp masks: keeping the previous version of \"", name, "\"")
                    pat, repl, pf, ok = p.pattern, p.replacement, p.prefilter, true
                end
            end
            if ok then
                n = n + 1
                patterns[n] = { name = name, pattern = pat, replacement = repl, requires = compile_prefilter(pf) }
            end
        end
    end

    state.patterns, state.n, state.errors = patterns, n, errors
    state.any = any_prefilter(patterns, n)
    state.digest, state.digest_raw = digest_of(patterns, n)
    state.path, state.last_good_path, state.loaded = path, lg_path, true

    if write then
        local ok, err = write_last_good(lg_path, patterns, n)
        if not ok then
            log(ngx and ngx.WARN, "zccp masks: cannot write the last-good file ", lg_path, ": ", err)
        end
    end
    log(ngx and ngx.NOTICE, "zccp masks: ", n, " pattern(s) in force, ", #errors, " error(s), digest ",
        state.digest)
    return n, errors
end

local function ensure()
    if not state.loaded then
        _M.init({ write_last_good = false })
    end
end

-- The compiled set in force, for zccp.fp.mask_apply (read-only): patterns[1..n] =
-- { name, pattern, replacement, requires = prefilters or nil }, any = the combined
-- prefilter or nil. Loads the files (without writing the last-good one) if init() has
-- not run.
function _M.current()
    ensure()
    return state
end

-- The patterns in force: a copy, { { name, pattern, replacement }, ... }.
function _M.patterns()
    ensure()
    local out = {}
    for i = 1, state.n do
        local p = state.patterns[i]
        out[i] = { name = p.name, pattern = p.pattern, replacement = p.replacement }
    end
    return out
end

-- The errors of the last init(): { { name = ..., message = ... }, ... }.
function _M.errors()
    ensure()
    local out = {}
    for i, e in ipairs(state.errors) do
        out[i] = { name = e.name, message = e.message, file = e.file, line = e.line }
    end
    return out
end

-- Hex SHA-256 of the set in force (zccp.cache.mask_apply.MaskSet.digest in Python gives the same).
function _M.digest()
    ensure()
    return state.digest
end

-- The same digest as 32 raw bytes (what nginx writes into a slot's request.mask_digest).
function _M.digest_raw()
    ensure()
    return state.digest_raw
end

function _M.count()
    ensure()
    return state.n
end

return _M
