-- One phase's runner (zccp.core.pipeline builds one per phase at init): its plugins'
-- calls one after the other, each plugin's raise isolated, in a shape LuaJIT compiles.
--
-- Why not one pcall per plugin: LuaJIT cannot record a return into a pcall frame from a
-- trace that started inside the pcall ("NYI: return to lower frame"). With a pcall around
-- every plugin, every trace that starts in a plugin (its function's own root trace, a side
-- exit anywhere in the limits' admission or settlement) aborts where the plugin returns,
-- and that code runs interpreted for good (bench/keys_cuts.md).
--
-- So one pcall runs the phase's plugins as one segment: a generated function calls plugin
-- from..n in turn, no loop (a loop of one to three turns is where root traces give up),
-- each plugin returning into it (a Lua frame). Before each call it writes the plugin's index
-- in r.pipeline_at; on a raise the runner names that plugin and, in the phases that run
-- every plugin, runs the segment again from the next one. Before the segment returns into
-- the pcall it calls one built-in LuaJIT does not compile (getfenv of a function): a trace
-- recorded through the plugins stops there (trace stitching) instead of aborting at the
-- return, so the plugins' code and their side exits get traces that complete; only the
-- few bytecodes after that call run interpreted.
local concat = table.concat
local load = load
local assert = assert
local pcall = pcall
local getfenv = getfenv

local _M = {}

-- The segment: plugins from..n. kind "run": DONE once one answers; "any": true once one
-- says so, else false; "every": each in turn.
local function segment(kind, n)
    local out = { "local fns, confs, DONE, land = ...\n",
                  "return function(r, from, a1, a2, a3)\n local res\n" }
    for i = 1, n do
        out[#out + 1] = (" if from <= %d then\n  r.pipeline_at = %d\n"):format(i, i)
        if kind == "any" then
            out[#out + 1] = ("  res = fns[%d](r, confs[%d])\n"
                .. "  if res then land(land) return true end\n"):format(i, i)
        elseif kind == "run" then
            out[#out + 1] = ("  res = fns[%d](r, confs[%d], a1, a2, a3)\n"
                .. "  if res == DONE then land(land) return DONE end\n"):format(i, i)
        else
            out[#out + 1] = (" fns[%d](r, confs[%d], a1, a2, a3)\n"):format(i, i)
        end
        out[#out + 1] = " end\n"
    end
    out[#out + 1] = kind == "any" and " land(land)\n return false\nend\n" or " land(land)\nend\n"
    return concat(out)
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
    return failed(r, names[at], res)
end
]],
    any = [[
local pcall, seg, failed, names = ...
return function(r)
    local prior = r.pipeline_at
    local ok, res = pcall(seg, r, 1)
    local at = r.pipeline_at
    r.pipeline_at = prior
    if ok then
        return res
    end
    return failed(r, names[at], res)
end
]],
    every = [[
local pcall, seg, counted, names = ...
return function(r, a1, a2, a3)
    local prior = r.pipeline_at
    local ok, res = pcall(seg, r, 1, a1, a2, a3)
    while not ok do
        local at = r.pipeline_at
        counted(r, names[at], res)
        ok, res = pcall(seg, r, at + 1, a1, a2, a3)
    end
    r.pipeline_at = prior
end
]],
}

local function none()
end

local function no()
    return false
end

-- kind: "run" | "any" | "every"; c: { n, fns, confs, names }; on_raise(r, name, err):
-- the pipeline's failed (run, any: its return is the runner's) or counted (every).
function _M.build(kind, phase, c, on_raise, DONE)
    if c.n == 0 then
        return kind == "any" and no or none
    end
    local name = "=zccp.core.pipeline[" .. phase .. "]"
    local seg = assert(load(segment(kind, c.n), name))(c.fns, c.confs, DONE, getfenv)
    return assert(load(RUNNERS[kind], name))(pcall, seg, on_raise, c.names)
end

_M.segment_source = segment   -- for the tests

return _M
