-- One phase's runner (zccp.core.pipeline builds one per phase at init): its plugins'
-- calls one after the other, each plugin's raise isolated, in a shape LuaJIT compiles.
--
-- Why not one pcall per plugin: LuaJIT cannot record a return into a pcall frame from a
-- trace that started inside the pcall ("NYI: return to lower frame"). With a pcall around
-- every plugin, every trace that starts in a plugin (its function's own root trace, a side
-- exit anywhere in the limits' admission or settlement) aborts where the plugin returns,
-- and that code runs interpreted for good (bench/keys_cuts.md).
--
-- So in the phases whose plugins do a request's real work (stop: the key check, the
-- admission, the cache's lookup, the settlement) one pcall runs the plugins as one
-- segment: a generated function calls plugin from..n in turn, no loop (a loop of one to
-- three turns is where root traces give up), each plugin returning into it (a Lua frame).
-- Before each call it writes the plugin's index in r.pipeline_at; on a raise the runner
-- names that plugin and, in the phases that run every plugin, runs the segment again from
-- the next one. Before the segment returns into the pcall it calls one built-in LuaJIT does
-- not compile (getfenv of a function): a trace recorded through the plugins stops there
-- (trace stitching) instead of aborting at the return, so the plugins' code and their side
-- exits get traces that complete; the few bytecodes after it run interpreted.
--
-- The other phases keep one pcall per plugin call: their plugins are a few lines each, and
-- a trace from the handler compiles through them, pcalls and all, which the stop would end
-- (measured: bench/keys_cuts.md).
local concat = table.concat
local load = load
local assert = assert
local pcall = pcall
local getfenv = getfenv

local _M = {}

-- The segment: plugins from..n. kind "run": DONE once one answers; "any": true once one
-- says so, else false; "every": each in turn; the built-in call before each return.
local function segment(kind, n)
    local land = "land(land) "
    local out = { "local fns, confs, DONE, land = ...\n",
                  "return function(r, from, a1, a2, a3)\n local res\n" }
    for i = 1, n do
        out[#out + 1] = (" if from <= %d then\n  r.pipeline_at = %d\n"):format(i, i)
        if kind == "any" then
            out[#out + 1] = ("  res = fns[%d](r, confs[%d])\n  if res then %sreturn true end\n"):format(i, i, land)
        elseif kind == "run" then
            out[#out + 1] = ("  res = fns[%d](r, confs[%d], a1, a2, a3)\n  if res == DONE then %sreturn DONE end\n")
                :format(i, i, land)
        else
            out[#out + 1] = ("  fns[%d](r, confs[%d], a1, a2, a3)\n"):format(i, i)
        end
        out[#out + 1] = " end\n"
    end
    out[#out + 1] = (" %s%s\nend\n"):format(land, kind == "any" and "return false" or "")
    local src = concat(out)
    return src
end

-- The per-plugin shape: plugins 1..n each in its own pcall, no segment.
local function each(kind, n)
    local out = { "local pcall, on_raise, DONE, fns, confs, names = ...\n",
                  "return function(r, a1, a2, a3)\n local ok, res\n" }
    for i = 1, n do
        if kind == "run" then
            out[#out + 1] = (" ok, res = pcall(fns[%d], r, confs[%d], a1, a2, a3)\n"
                .. " if not ok then return on_raise(r, names[%d], res) end\n"
                .. " if res == DONE then return DONE end\n"):format(i, i, i)
        elseif kind == "any" then
            out[#out + 1] = (" ok, res = pcall(fns[%d], r, confs[%d])\n"
                .. " if ok and res then return true elseif not ok then return on_raise(r, names[%d], res) end\n"
                ):format(i, i, i)
        else
            out[#out + 1] = (" ok, res = pcall(fns[%d], r, confs[%d], a1, a2, a3)\n"
                .. " if not ok then on_raise(r, names[%d], res) end\n"):format(i, i, i)
        end
    end
    out[#out + 1] = kind == "any" and " return false\nend\n" or "end\n"
    local src = concat(out)
    return src
end

-- The runner around it. r.pipeline_at is put back as it was on entry: a phase run inside a
-- plugin of another (a refusal's answer runs the response phase) must not leave its index
-- for the outer one to read.
local RUNNERS = {
    run = [[
local pcall, seg, failed, names = ...
return function(r, a1, a2, a3)
    local prior = r.pipeline_at
    local ok, res = pcall(seg, r, 1, a1, a2, a3)
    local at = r.pipeline_at
    r.pipeline_at = prior
    if ok then
        return res
    end
    return failed(r, names[at] or "?", res)
end
]],
    every = [[
local pcall, seg, counted, names = ...
local tonumber, huge = tonumber, math.huge
return function(r, a1, a2, a3)
    local prior = r.pipeline_at
    local ok, res = pcall(seg, r, 1, a1, a2, a3)
    while not ok do
        local at = tonumber(r.pipeline_at) or huge   -- a plugin that broke it: the rest is skipped
        counted(r, names[at] or "?", res)
        ok, res = pcall(seg, r, at + 1, a1, a2, a3)
    end
    r.pipeline_at = prior
end
]],
}
RUNNERS.any = RUNNERS.run   -- its segment takes (r, from) and ignores the rest

local function none()
end

local function no()
    return false
end

-- kind: "run" | "any" | "every"; c: { n, fns, confs, names }; on_raise(r, name, err):
-- the pipeline's failed (run, any: its return is the runner's) or counted (every); stop:
-- the segment's shape (above), else one pcall per plugin.
function _M.build(kind, phase, c, on_raise, DONE, stop)
    if c.n == 0 then
        return kind == "any" and no or none
    end
    local name = "=zccp.core.pipeline[" .. phase .. "]"
    if not stop then
        return assert(load(each(kind, c.n), name))(pcall, on_raise, DONE, c.fns, c.confs, c.names)
    end
    local seg = assert(load(segment(kind, c.n), name))(c.fns, c.confs, DONE, getfenv)
    return assert(load(RUNNERS[kind], name))(pcall, seg, on_raise, c.names)
end

_M.segment_source = segment   -- for the tests

return _M
