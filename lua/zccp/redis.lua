-- A small Redis client for nginx (RESP2 over a pooled cosocket): the key lookups of
-- zccp.auth and the counters of zccp.limits. One server (TCP or a unix socket) or a Redis
-- Cluster (any node to start; a MOVED or ASK redirect is followed once and remembered per
-- hash tag). No TLS, no Sentinel: the config refuses those for nginx (zccp.config).
--
--   local redis = require "zccp.redis"
--   local t = redis.target({ host = "127.0.0.1", port = 6379, db = 0, timeout_ms = 100 })
--   local v, err = t:call("GET", "k")       -- nil, nil: a null reply; nil, err: failure
--   local r, err = t:call("EVALSHA", ...)   -- an error reply is nil, "redis: ..."
local ngx = ngx
local tcp = ngx.socket.tcp
local tonumber = tonumber
local tostring = tostring
local concat = table.concat
local str_sub = string.sub
local str_match = string.match
local str_byte = string.byte
local setmetatable = setmetatable
local select = select
local ipairs = ipairs
local unpack = unpack

local _M = { _VERSION = "0.1.0" }

local POOL_IDLE_MS = 60000
local POOL_SIZE = 32
local MAX_BULK = 1048576      -- a reply is data from the network: bounded

local Target = {}
Target.__index = Target

-- opts: { host, port } or { path } (unix socket), password, username, db, cluster (bool),
-- timeout_ms.
function _M.target(opts)
    return setmetatable({ opts = opts, moved = {} }, Target)
end

local function encode(n, ...)
    local out = { "*", n, "\r\n" }
    for i = 1, n do
        local a = tostring((select(i, ...)))
        out[#out + 1] = "$"
        out[#out + 1] = #a
        out[#out + 1] = "\r\n"
        out[#out + 1] = a
        out[#out + 1] = "\r\n"
    end
    return concat(out)
end

local function read_reply(sock, depth)
    local line, err = sock:receive("*l")
    if not line then
        return nil, err
    end
    local p = str_byte(line, 1)
    local rest = str_sub(line, 2)
    if p == 43 then                 -- '+'
        return rest
    elseif p == 45 then             -- '-'
        return nil, "redis: " .. rest, true
    elseif p == 58 then             -- ':'
        return tonumber(rest)
    elseif p == 36 then             -- '$'
        local n = tonumber(rest)
        if not n or n > MAX_BULK then
            return nil, "bad bulk length"
        end
        if n < 0 then
            return nil
        end
        local data, rerr = sock:receive(n + 2)
        if not data then
            return nil, rerr
        end
        return str_sub(data, 1, n)
    elseif p == 42 then             -- '*'
        local n = tonumber(rest)
        if not n or n > 65536 or depth > 4 then
            return nil, "bad array"
        end
        if n < 0 then
            return nil
        end
        local arr = {}
        for i = 1, n do
            local v, verr, is_err = read_reply(sock, depth + 1)
            if verr and not is_err then
                return nil, verr
            end
            arr[i] = v == nil and ngx.null or v
        end
        return arr
    end
    return nil, "bad reply"
end

local function connect(self, host, port)
    local o = self.opts
    local sock = tcp()
    sock:settimeout(o.timeout_ms)
    local ok, err
    if o.path then
        ok, err = sock:connect("unix:" .. o.path)
    else
        ok, err = sock:connect(host, port)
    end
    if not ok then
        return nil, err
    end
    if sock:getreusedtimes() == 0 then
        local setup = {}
        if o.password then
            setup[#setup + 1] = o.username and encode(3, "AUTH", o.username, o.password) or encode(2, "AUTH", o.password)
        end
        if o.db and o.db ~= 0 then
            setup[#setup + 1] = encode(2, "SELECT", o.db)
        end
        if #setup > 0 then
            local _, serr = sock:send(concat(setup))
            if serr then
                sock:close()
                return nil, serr
            end
            for _ = 1, #setup do
                local _, rerr = read_reply(sock, 0)
                if rerr then
                    sock:close()
                    return nil, rerr
                end
            end
        end
    end
    return sock
end

-- The hash tag of a key (what Redis Cluster hashes), for the redirect memory.
local function tag_of(key)
    return str_match(key, "{([^}]+)}") or key
end

-- One command: its reply, or nil, err. `key`: the key it touches (Cluster routing).
function Target:call_key(key, ...)
    local o = self.opts
    local n = select("#", ...)
    local req = encode(n, ...)
    local tag = key and o.cluster and tag_of(key)
    local to = tag and self.moved[tag]
    local host, port = o.host, o.port
    if to then
        host, port = to[1], to[2]
    end
    local asking = false
    for _ = 1, 3 do
        local sock, err = connect(self, host, port)
        if not sock then
            return nil, err
        end
        local _, serr = sock:send(asking and encode(1, "ASKING") .. req or req)
        if serr then
            sock:close()
            return nil, serr
        end
        if asking then
            local _, aerr, is_err = read_reply(sock, 0)
            if aerr and not is_err then
                sock:close()
                return nil, aerr
            end
        end
        local v, rerr, is_err = read_reply(sock, 0)
        if rerr and not is_err then
            sock:close()
            return nil, rerr
        end
        sock:setkeepalive(POOL_IDLE_MS, POOL_SIZE)
        if not is_err then
            return v
        end
        local kind, h, p = str_match(rerr, "^redis: (%u+) %d+ (.+):(%d+)$")
        if not o.cluster or (kind ~= "MOVED" and kind ~= "ASK") then
            return nil, rerr
        end
        host, port, asking = h, tonumber(p), kind == "ASK"
        if kind == "MOVED" and tag then
            self.moved[tag] = { host, port }
        end
    end
    return nil, "redis: too many redirects"
end

function Target:call(cmd, key, ...)
    return self:call_key(key, cmd, key, ...)
end

-- Several commands, each { key, arg1, arg2, ... }: one write and one read on one server;
-- on a Cluster, one by one (each to its node). Returns the number that failed, and the
-- last error.
function Target:pipeline(cmds)
    local failed, last = 0, nil
    if self.opts.cluster then
        for _, c in ipairs(cmds) do
            local _, err = self:call_key(c[1], unpack(c, 2))
            if err then
                failed, last = failed + 1, err
            end
        end
        return failed, last
    end
    local sock, err = connect(self, self.opts.host, self.opts.port)
    if not sock then
        return #cmds, err
    end
    local out = {}
    for i, c in ipairs(cmds) do
        out[i] = encode(#c - 1, unpack(c, 2))
    end
    local _, serr = sock:send(out)
    if serr then
        sock:close()
        return #cmds, serr
    end
    for _ = 1, #cmds do
        local _, rerr, is_err = read_reply(sock, 0)
        if rerr then
            if not is_err then
                sock:close()
                return #cmds, rerr
            end
            failed, last = failed + 1, rerr
        end
    end
    sock:setkeepalive(POOL_IDLE_MS, POOL_SIZE)
    return failed, last
end

return _M
