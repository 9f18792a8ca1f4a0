-- nginx's Redis (the key lookups of the auth plugin, the counters of the limits plugin and its leases,
-- zccp.admin.keys' records) over lua-resty-redis: Debian's lua-nginx-redis installs it as
-- nginx.redis (OpenResty's name, resty.redis, is taken where that one is missing). The
-- library speaks RESP over a pooled cosocket; what stays ours is thin (docs/libraries.md):
--   * one target object per Redis: a server (TCP or a unix socket), a Redis Cluster (any
--     node to start; a MOVED or ASK redirect is followed, MOVED remembered per hash tag:
--     the libraries have no Cluster client), or the master Sentinels name (asked through
--     lua-resty-redis-connector, Debian's lua-nginx-redis-connector; kept 1 s per worker,
--     asked again at once when the master refuses a connection or a write);
--   * AUTH and SELECT once per new connection (a pooled one is already set up), a pool of
--     its own per server, database and user;
--   * replies as this module always gave them: a null reply is nil, an error reply is
--     nil, "redis: <message>", a failure is nil, err.
-- No TLS: lua-resty-redis 0.27 has none (the config refuses rediss:// for nginx).
--
--   local redis = require "zccp.lib.redis"
--   local t = redis.target({ host = "127.0.0.1", port = 6379, db = 0, timeout_ms = 100 })
--   local v, err = t:call("GET", "k")       -- nil, nil: a null reply; nil, err: failure
--   local r, err = t:call("EVALSHA", ...)   -- an error reply is nil, "redis: ..."
-- Debian's module name, else OpenResty's (opm, luarocks)
local function lib(debian, openresty)
    local ok, m = pcall(require, debian)
    if ok then
        return m
    end
    return require(openresty)
end

local resty_redis = lib("nginx.redis", "resty.redis")

local ngx = ngx
local null = ngx.null
local now = ngx.now
local type = type
local tonumber = tonumber
local tostring = tostring
local setmetatable = setmetatable
local ipairs = ipairs
local unpack = unpack
local str_match = string.match
local str_find = string.find
local io_open = io.open

local _M = { _VERSION = "0.2.0" }

local POOL_IDLE_MS = 60000
local POOL_SIZE = 32
local MASTER_TTL_S = 1        -- how long a worker trusts the Sentinels' answer
local MAX_REDIRECTS = 3

local Target = {}
Target.__index = Target

-- opts: { host, port } or { path } (unix socket), password, username, db, timeout_ms;
-- cluster = true (host, port: a startup node); or sentinels = { { host, port }, ... },
-- master_name, sentinel_password (the master's address comes from them).
function _M.target(opts)
    -- epoch: how many times the Sentinels named a master other than the last one (a
    -- caller that keeps state in Redis writes it again: the new master may have missed it)
    local self = setmetatable({ opts = opts, moved = {}, pools = {}, master = nil, epoch = 0 }, Target)
    if opts.sentinels then
        local connector = lib("nginx.redis.connector", "resty.redis.connector")
        local list = {}
        for i, s in ipairs(opts.sentinels) do
            list[i] = { host = s.host, port = s.port, password = opts.sentinel_password }
        end
        local c, err = connector.new({
            connect_timeout = opts.timeout_ms, read_timeout = opts.timeout_ms,
            keepalive_timeout = POOL_IDLE_MS, keepalive_poolsize = POOL_SIZE,
            master_name = opts.master_name, sentinels = list,
        })
        if not c then
            error("zccp.lib.redis: sentinel settings: " .. tostring(err))   -- rendered by us: a bug
        end
        self.connector, self.sentinel_list = c, list
    end
    return self
end

-- connect()'s options for host:port: a pool named for the server, the database and the
-- user, so that connections set up for one are never handed to another (built once).
local function pool_opts(self, host, port)
    local by_host = self.pools[host]
    if not by_host then
        by_host = {}
        self.pools[host] = by_host
    end
    local p = by_host[port]
    if not p then
        local o = self.opts
        p = { pool = "zccp:" .. host .. ":" .. tostring(port) .. "/" .. tostring(o.db or 0)
                     .. "/" .. tostring(o.username or "") }
        by_host[port] = p
    end
    return p
end

-- A connection to host:port (the unix socket when opts.path), set up: AUTH and SELECT on
-- a new one only. nil, err on failure (closed).
local function connect(self, host, port)
    local o = self.opts
    local r, err = resty_redis:new()
    if not r then
        return nil, err
    end
    r:set_timeout(o.timeout_ms)
    local ok
    if o.path then
        host, port = "unix:" .. o.path, 0
        ok, err = r:connect(host, pool_opts(self, host, port))
    else
        ok, err = r:connect(host, port, pool_opts(self, host, port))
    end
    if not ok then
        return nil, err
    end
    if r:get_reused_times() == 0 then
        local res
        if o.password then
            if o.username then
                res, err = r:auth(o.username, o.password)
            else
                res, err = r:auth(o.password)
            end
            if not res then
                r:close()
                return nil, res == false and "redis: " .. tostring(err) or err
            end
        end
        if o.db and o.db ~= 0 then
            res, err = r:select(o.db)
            if not res then
                r:close()
                return nil, res == false and "redis: " .. tostring(err) or err
            end
        end
    end
    return r
end

local function done(r)
    r:set_keepalive(POOL_IDLE_MS, POOL_SIZE)
end

-- One command on connection r: the reply (ngx.null: nil), or nil, err; is_reply: an error
-- reply (the connection is still good and back in the pool) rather than a failure.
local function run(r, cmd, ...)
    local res, err = r[cmd](r, ...)
    if res == nil then
        r:close()
        return nil, err, false
    end
    done(r)
    if res == false then
        return nil, "redis: " .. tostring(err), true
    end
    if res == null then
        return nil
    end
    return res
end

-- A Redis password from its owner-only file (engine/zccp/ops/nginx_conf.py writes it; the
-- rendered config names the file, never the secret): read by nginx's master in init_by_lua,
-- so workers inherit it whatever their user. A failure stops nginx's start.
function _M.read_secret(path)
    local f, err = io_open(path, "rb")
    if not f then
        error("auth.redis_url: cannot read the Redis password file: " .. tostring(err))
    end
    local s = f:read("*a")
    f:close()
    if not s or s == "" then
        error("auth.redis_url: " .. path .. " is empty")
    end
    return s
end

-- Sentinel: the master's address, the one this worker was told within MASTER_TTL_S unless
-- `fresh`. The connector connects to the first Sentinel that answers; the question is
-- asked with our timeout on that connection.
local get_master
local function master_of(self, fresh)
    local m = self.master
    local t = now()
    if m and not fresh and t < m.expires then
        return m.host, m.port
    end
    self.master = nil
    local s, err = self.connector:try_hosts(self.sentinel_list)
    if not s then
        return nil, "redis sentinels: " .. tostring(err)
    end
    s:set_timeout(self.opts.timeout_ms)
    if not get_master then
        get_master = lib("nginx.redis.sentinel", "resty.redis.sentinel").get_master
    end
    local addr, gerr = get_master(s, self.opts.master_name)
    if not addr then
        s:close()
        return nil, "redis sentinel: no master named " .. tostring(self.opts.master_name)
                    .. (gerr and " (" .. tostring(gerr) .. ")" or "")
    end
    s:set_keepalive(POOL_IDLE_MS, POOL_SIZE)
    local port = tonumber(addr.port)
    local last = self.last_master
    if last and (last.host ~= addr.host or last.port ~= port) then
        self.epoch = self.epoch + 1
    end
    self.master = { host = addr.host, port = port, expires = t + MASTER_TTL_S }
    self.last_master = self.master
    return addr.host, port
end

-- An error reply that says this server is no longer (or not yet) the master: nothing was
-- done, and the Sentinels are asked again.
local function not_master(err)
    return err and (str_find(err, "READONLY", 1, true) or str_find(err, "MASTERDOWN", 1, true)
                    or str_find(err, "LOADING", 1, true)) and true or false
end

-- f(self, r, ...) on a connection to the master the Sentinels name; f returns its results
-- and, third, whether the server answered as a replica (nothing was done). Once more with
-- the Sentinels asked again when the master refused the connection or answered as a
-- replica, if they now name another one (never after a failure mid-command: it may have run).
local function on_master(self, f, ...)
    local last_host, last_port, last_err
    for attempt = 1, 2 do
        local host, port = master_of(self, attempt == 2)
        if not host then
            return nil, port
        end
        if attempt == 2 and host == last_host and port == last_port then
            break
        end
        last_host, last_port = host, port
        local r, err = connect(self, host, port)
        if r then
            local a, b, again = f(self, r, ...)
            if not again then
                return a, b
            end
            last_err = b
        else
            last_err = err
        end
        self.master = nil
    end
    return nil, last_err
end

local function run_on_master(_, r, cmd, ...)
    local v, err, is_reply = run(r, cmd, ...)
    return v, err, is_reply and not_master(err)
end

-- The hash tag of a key (what Redis Cluster hashes), for the redirect memory.
local function tag_of(key)
    return str_match(key, "{([^}]+)}") or key
end

local function cluster_call(self, key, cmd, ...)
    local o = self.opts
    local tag = key and tag_of(key)
    local to = tag and self.moved[tag]
    local host, port = o.host, o.port
    if to then
        host, port = to[1], to[2]
    end
    local asking = false
    for _ = 1, MAX_REDIRECTS do
        local r, err = connect(self, host, port)
        if not r then
            return nil, err
        end
        if asking then
            local ok, aerr = r:asking()
            if not ok then
                r:close()
                return nil, ok == false and "redis: " .. tostring(aerr) or aerr
            end
        end
        local v, rerr, is_reply = run(r, cmd, ...)
        if not is_reply then
            return v, rerr
        end
        local kind, h, p = str_match(rerr, "^redis: (%u+) %d+ (.+):(%d+)$")
        if kind ~= "MOVED" and kind ~= "ASK" then
            return nil, rerr
        end
        host, port, asking = h, tonumber(p), kind == "ASK"
        if kind == "MOVED" and tag then
            self.moved[tag] = { host, port }
        end
    end
    return nil, "redis: too many redirects"
end

-- One command: its reply, or nil, err. `key`: the key it touches (Cluster routing).
function Target:call_key(key, cmd, ...)
    local o = self.opts
    if o.cluster then
        return cluster_call(self, key, cmd, ...)
    end
    if self.connector then
        return on_master(self, run_on_master, cmd, ...)
    end
    local r, err = connect(self, o.host, o.port)
    if not r then
        return nil, err
    end
    local v, rerr = run(r, cmd, ...)
    return v, rerr
end

function Target:call(cmd, key, ...)
    return self:call_key(key, cmd, key, ...)
end

-- cmds on connection r in one write and one read: the number that failed, the last error.
local function pipelined(_, r, cmds)
    r:init_pipeline(#cmds)
    for _, c in ipairs(cmds) do
        local cmd = c[2]
        r[cmd](r, unpack(c, 3))
    end
    local res, err = r:commit_pipeline()
    if not res then
        r:close()
        return #cmds, err
    end
    done(r)
    local failed, last = 0, nil
    for i = 1, #res do
        local v = res[i]
        if type(v) == "table" and v[1] == false then
            failed, last = failed + 1, "redis: " .. tostring(v[2])
        end
    end
    return failed, last
end

local function pipelined_on_master(self, r, cmds)
    local failed, last = pipelined(self, r, cmds)
    return failed, last, failed == #cmds and not_master(last)
end

-- Several commands, each { key, arg1, arg2, ... }: one write and one read on one server;
-- on a Cluster, one by one (each to its node). Returns the number that failed, and the
-- last error.
function Target:pipeline(cmds)
    local o = self.opts
    if o.cluster then
        local failed, last = 0, nil
        for _, c in ipairs(cmds) do
            local _, err = cluster_call(self, c[1], unpack(c, 2))
            if err then
                failed, last = failed + 1, err
            end
        end
        return failed, last
    end
    if self.connector then
        local failed, err = on_master(self, pipelined_on_master, cmds)
        if failed == nil then
            return #cmds, err
        end
        return failed, err
    end
    local r, err = connect(self, o.host, o.port)
    if not r then
        return #cmds, err
    end
    return pipelined(self, r, cmds)
end

return _M
