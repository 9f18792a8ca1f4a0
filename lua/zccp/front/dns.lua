-- The front tier's DNS question: the A records of one name, asked through lua-resty-dns
-- (Debian's lua-nginx-dns installs it as nginx.dns.resolver; OpenResty's name is
-- resty.dns.resolver). The library sends the query, reads past answers to other queries,
-- retransmits after a timeout and retries over TCP when the UDP answer is truncated (a
-- few hundred hosts do not fit 512 bytes). What stays ours: the answer is untrusted input,
-- so a Lua error inside the library is an error here, and only well-formed IPv4 addresses
-- of A records in class IN are taken.
--
--   local dns = require "zccp.front.dns"
--   local ips, err = dns.query_a("zccp-hosts.ns.svc.cluster.local", "10.96.0.10", 53, 2000)
--   -- ips: { "10.0.0.7", ... } in answer order (possibly empty: NODATA), or nil, err
local ok_lib, resolver = pcall(require, "nginx.dns.resolver")
if not ok_lib then
    resolver = require "resty.dns.resolver"
end

local type = type
local pcall = pcall
local tonumber = tonumber
local tostring = tostring
local str_match = string.match
local ceil = math.ceil

local _M = { _VERSION = "0.2.0" }

local TYPE_A, CLASS_IN = resolver.TYPE_A, 1
-- Two sends per question (the library's retransmission), each waiting half the timeout:
-- a lost datagram is asked again, and one question still takes at most timeout_ms over UDP.
local RETRANS = 2

-- rcodes the library names (resolver_errstrs), as our log says them
local RCODE = { [1] = "format error", [2] = "server failure", [3] = "name not found (NXDOMAIN)",
                [4] = "not implemented", [5] = "refused" }

-- "a.b.c.d" with four octets 0..255, or nil: the library builds an A record's address from
-- the bytes it finds, and a record cut short at the packet's end gives fewer than four.
local function ipv4(s)
    if type(s) ~= "string" then
        return nil
    end
    local a, b, c, d = str_match(s, "^(%d+)%.(%d+)%.(%d+)%.(%d+)$")
    if not a then
        return nil
    end
    a, b, c, d = tonumber(a), tonumber(b), tonumber(c), tonumber(d)
    if a > 255 or b > 255 or c > 255 or d > 255 then
        return nil
    end
    return s
end

-- The IPv4 addresses in the library's answers table, or nil, err.
function _M.addresses(answers)
    if answers.errcode then
        local code = answers.errcode
        return nil, RCODE[code] or ("server error (rcode " .. tostring(code) .. ")")
    end
    local ips = {}
    for i = 1, #answers do
        local ans = answers[i]
        if ans.type == TYPE_A and ans.class == CLASS_IN then
            local ip = ipv4(ans.address)
            if not ip then
                return nil, "malformed A record"
            end
            ips[#ips + 1] = ip
        end
    end
    return ips
end

local function ask(name, server, port, timeout_ms)
    local r, err = resolver:new({
        nameservers = { { server, port } },
        retrans = RETRANS,
        timeout = ceil(timeout_ms / RETRANS),
    })
    if not r then
        return nil, "resolver " .. server .. ":" .. port .. ": " .. tostring(err)
    end
    local answers, qerr = r:query(name, { qtype = TYPE_A })
    if not answers then
        return nil, qerr
    end
    return _M.addresses(answers)
end

-- Ask `server`:`port` for `name`'s A records (a cosocket: timers and request phases).
function _M.query_a(name, server, port, timeout_ms)
    if type(name) ~= "string" or name == "" or #name > 253 then
        return nil, "bad name"
    end
    -- the library indexes the packet without checking every length: a hostile answer can
    -- raise inside it (a nil byte past the end); that is this answer's error, not the timer's
    local ok, ips, err = pcall(ask, name, server, port, timeout_ms)
    if not ok then
        return nil, "malformed answer (" .. tostring(ips) .. ")"
    end
    return ips, err
end

return _M
