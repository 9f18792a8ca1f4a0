-- Applies the mask set in force (zccp.fp.mask_store) to prompt text (docs/fingerprint.md,
-- "Masks"): every pattern in order, each with ngx.re.gsub(s, pattern, replacement, "jo")
-- on the result of the previous one, skipped where its prefilters find nothing.
-- engine/zccp/cache/mask_apply.py (MaskSet.apply, mask_doc) masks byte for byte alike.
local mask_store = require "zccp.fp.mask_store"

local ngx = ngx
local type = type
local next = next
local ipairs = ipairs
local error = error
local tostring = tostring

local _M = { _VERSION = "0.1.0" }

local re_gsub = ngx and ngx.re and ngx.re.gsub
local re_find = ngx and ngx.re and ngx.re.find

-- Every pattern of `set` (mask_store.current()) on `s`: the masked string and whether
-- it differs from `s`, or nil, err.
local function apply_set(set, s)
    local any = set.any
    if any then
        local from, _, err = re_find(s, any, "jo")
        if not from and not err then
            return s, false
        end
    end
    local orig = s
    local patterns = set.patterns
    local found, found_in     -- prefilter results (regex -> found) for the string found_in
    for i = 1, set.n do
        local p = patterns[i]
        local req = p.requires
        local run = true
        if req then
            if found_in ~= s then
                found, found_in = {}, s
            end
            for j = 1, #req do
                local rx = req[j]
                local f = found[rx]
                if f == nil then
                    local from, _, err = re_find(s, rx, "jo")
                    f = from ~= nil or err ~= nil   -- a failed search skips nothing
                    found[rx] = f
                end
                if not f then
                    run = false
                    break
                end
            end
        end
        if run then
            local r, cnt, err = re_gsub(s, p.pattern, p.replacement, "jo")
            if not r then
                return nil, "mask \"" .. p.name .. "\": " .. tostring(err)
            end
            if cnt > 0 then
                s = r
            end
        end
    end
    return s, s ~= orig
end

-- Applies every pattern in order. Returns the masked string and whether it differs
-- from `s`, or nil, err (a PCRE runtime failure such as the match limit).
function _M.apply(s)
    if type(s) ~= "string" then
        error("zccp.fp.mask_apply.apply: string expected", 2)
    end
    return apply_set(mask_store.current(), s)
end

-- What gets masked in a decoded request (§2): the top-level `system` string, and inside
-- `system` and `messages` every string that is the value of a member named in
-- fp_tables.masked_keys. Replaced in place.
local MASKED = {}
for _, k in ipairs(require("zccp.fp.tables").masked_keys) do
    MASKED[k] = true
end

local function mask_string(ctx, s)
    local out, changed_or_err = apply_set(ctx.set, s)
    if not out then
        ctx.err = changed_or_err
        return s
    end
    if changed_or_err then
        ctx.changed = true
    end
    return out
end

local function mask_walk(ctx, t)
    if t[1] ~= nil then
        for i = 1, #t do
            local v = t[i]
            if type(v) == "table" then
                mask_walk(ctx, v)
            end
        end
    else
        for k, v in next, t do
            local tv = type(v)
            if tv == "string" then
                if MASKED[k] then
                    t[k] = mask_string(ctx, v)
                end
            elseif tv == "table" then
                mask_walk(ctx, v)
            end
        end
    end
end

-- Masks a decoded request in place. Returns whether a mask changed some text, or
-- nil, err (a PCRE runtime failure).
function _M.apply_doc(doc)
    local ctx = { changed = false, err = nil, set = mask_store.current() }
    local system = doc.system
    if type(system) == "string" then
        doc.system = mask_string(ctx, system)
    elseif type(system) == "table" then
        mask_walk(ctx, system)
    end
    if type(doc.messages) == "table" then
        mask_walk(ctx, doc.messages)
    end
    if ctx.err then
        return nil, ctx.err
    end
    return ctx.changed
end

return _M
