-- A DNS client for one question: the A records of a name (RFC 1035 over UDP, with an
-- EDNS0 OPT record so that a few hundred hosts fit one answer). The front tier's host list
-- (zccp.front_hosts) comes from it: Debian packages no lua-resty-dns.
--
--   local dns = require "zccp.front_dns"
--   local ips, err = dns.query_a("zccp-hosts.ns.svc.cluster.local", "10.96.0.10", 53, 2000)
--   -- ips: { "10.0.0.7", ... } in answer order (possibly empty: NODATA), or nil, err
--
-- The answer is untrusted input: every length is checked against the packet before use.
local bit = require "bit"

local ngx = ngx
local type = type
local tostring = tostring
local str_byte = string.byte
local str_char = string.char
local str_format = string.format
local str_gmatch = string.gmatch
local concat = table.concat
local random = math.random
local band, rshift = bit.band, bit.rshift

local _M = { _VERSION = "0.1.0" }

local TYPE_A, CLASS_IN, TYPE_OPT = 1, 1, 41
local UDP_SIZE = 4096            -- what the OPT record advertises, and what we receive

local function u16(n)
    return str_char(rshift(n, 8), band(n, 0xff))
end

-- The query packet for `name`'s A records with message id `id`, or nil, err.
function _M.build_query(name, id)
    if type(name) ~= "string" or name == "" or #name > 253 then
        return nil, "bad name"
    end
    local parts = {
        u16(id), u16(0x0100),    -- recursion desired
        u16(1), u16(0), u16(0), u16(1),   -- one question, one additional (OPT)
    }
    for label in str_gmatch(name, "[^.]+") do
        if #label > 63 then
            return nil, "label longer than 63 bytes"
        end
        parts[#parts + 1] = str_char(#label) .. label
    end
    parts[#parts + 1] = "\0" .. u16(TYPE_A) .. u16(CLASS_IN)
    -- OPT: root name, type 41, class = UDP payload size, ttl 0 (no DO), no options
    parts[#parts + 1] = "\0" .. u16(TYPE_OPT) .. u16(UDP_SIZE) .. "\0\0\0\0" .. u16(0)
    return concat(parts)
end

-- The offset just past the (possibly compressed) name at `pos` (1-based), or nil. Names
-- are skipped, never read: a pointer ends the name where it stands, so no pointer is
-- followed (and none can loop).
local function skip_name(p, pos, len)
    while pos <= len do
        local b = str_byte(p, pos)
        if b == 0 then
            return pos + 1
        elseif b >= 0xc0 then    -- a pointer ends the name here
            if pos + 1 > len then
                return nil
            end
            return pos + 2
        elseif b >= 0x40 then    -- 0x40/0x80: reserved label types
            return nil
        end
        pos = pos + 1 + b
    end
    return nil
end

local function get16(p, pos)
    local a, b = str_byte(p, pos, pos + 1)
    return a * 256 + b
end

-- The IPv4 addresses in an answer to query `id`, or nil, err. An answer whose id is not
-- `id` is "mismatched id" (the caller reads the next datagram).
function _M.parse_a(p, id)
    local len = #p
    if len < 12 then
        return nil, "short answer"
    end
    if get16(p, 1) ~= id then
        return nil, "mismatched id"
    end
    local flags = get16(p, 3)
    if band(flags, 0x8000) == 0 then
        return nil, "not an answer"
    end
    if band(flags, 0x0200) ~= 0 then
        return nil, "truncated answer"
    end
    local rcode = band(flags, 0x000f)
    if rcode ~= 0 then
        return nil, rcode == 3 and "name not found (NXDOMAIN)" or "server error (rcode " .. rcode .. ")"
    end
    local qd, an = get16(p, 5), get16(p, 7)
    local pos = 13
    for _ = 1, qd do
        pos = skip_name(p, pos, len)
        if not pos or pos + 3 > len then
            return nil, "malformed question"
        end
        pos = pos + 4
    end
    local ips = {}
    for _ = 1, an do
        pos = skip_name(p, pos, len)
        if not pos or pos + 9 > len then
            return nil, "malformed answer"
        end
        local rtype, rclass, rdlen = get16(p, pos), get16(p, pos + 2), get16(p, pos + 8)
        pos = pos + 10
        if pos + rdlen - 1 > len then
            return nil, "malformed answer"
        end
        if rtype == TYPE_A and rclass == CLASS_IN and rdlen == 4 then
            local a, b, c, d = str_byte(p, pos, pos + 3)
            ips[#ips + 1] = str_format("%d.%d.%d.%d", a, b, c, d)
        end
        pos = pos + rdlen
    end
    return ips
end

-- Ask `server`:`port` for `name`'s A records (a cosocket: timers and request phases).
function _M.query_a(name, server, port, timeout_ms)
    local id = random(0, 65535)
    local q, qerr = _M.build_query(name, id)
    if not q then
        return nil, qerr
    end
    local sock = ngx.socket.udp()
    sock:settimeout(timeout_ms)
    local ok, err = sock:setpeername(server, port)
    if not ok then
        return nil, "resolver " .. server .. ":" .. port .. ": " .. tostring(err)
    end
    ok, err = sock:send(q)
    if not ok then
        sock:close()
        return nil, "send: " .. tostring(err)
    end
    -- a late answer to an earlier query may arrive first: read past it
    for _ = 1, 4 do
        local data, rerr = sock:receive(UDP_SIZE)
        if not data then
            sock:close()
            return nil, "receive: " .. tostring(rerr)
        end
        local ips, perr = _M.parse_a(data, id)
        if ips or perr ~= "mismatched id" then
            sock:close()
            return ips, perr
        end
    end
    sock:close()
    return nil, "no answer with our id"
end

return _M
