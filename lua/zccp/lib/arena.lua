-- Maps each engine's arena into this nginx worker (zccp.lib.engines: one, or each of
-- engines:) and re-maps when an engine's epoch changes (an engine restart creates a new
-- shm object). Everything read from the control page is validated before it is used to
-- compute an address. Functions taking `e` take an engine record (zccp.lib.engines); nil is
-- the first engine (the only one without engines:).
local ffi = require "ffi"
local abi = require "zccp.lib.abi"
local libc = require "zccp.lib.libc"
local engines = require "zccp.lib.engines"

local C = libc.C
local ffi_cast = ffi.cast
local tonumber = tonumber
local setmetatable = setmetatable
local ipairs = ipairs
local bor = require("bit").bor

local _M = { _VERSION = "0.1.0" }

local mt = { __index = _M }

local current = {}   -- engine name -> the arena its new requests use
local MAX_ARENA = 64 * 1024 * 1024 * 1024

local function validate_control(c, size)
    local K = abi.C
    if c.magic ~= K.ZCCP_CONTROL_MAGIC then
        return nil, "arena not ready (control magic missing)"
    end
    if c.abi_version ~= K.ZCCP_ABI_VERSION then
        return nil, "arena ABI version " .. tonumber(c.abi_version) .. " ~= " .. tonumber(K.ZCCP_ABI_VERSION)
    end
    local page = K.ZCCP_PAGE_SIZE
    local count, slot_size = tonumber(c.slot_count), tonumber(c.slot_size)
    if count < 1 or slot_size < 2 * page or slot_size % page ~= 0 then
        return nil, "arena geometry invalid"
    end
    if page + count * slot_size ~= size then
        return nil, "arena size " .. size .. " does not match its control page"
    end
    local regions = {
        { c.payload_offset, c.payload_cap },
        { c.tokens_offset, c.tokens_cap * 4 },
        { c.response_offset, c.response_cap },
    }
    local prev_end = page
    for i = 1, 3 do
        local off, len = tonumber(regions[i][1]), tonumber(regions[i][2])
        if off % page ~= 0 or off < prev_end or len < 1 or off + len > slot_size then
            return nil, "arena region " .. i .. " out of bounds"
        end
        prev_end = off + len
    end
    return true
end

local function open_arena(name)
    local fd = C.shm_open(name, libc.O_RDWR, 0)
    if fd < 0 then
        if ffi.errno() == libc.ENOENT then
            return nil, "engine not running (no arena " .. name .. ")"
        end
        return nil, "shm_open " .. name .. ": " .. libc.errstr()
    end
    local size = tonumber(C.lseek(fd, 0, libc.SEEK_END))
    if size < abi.C.ZCCP_CONTROL_SIZE or size > MAX_ARENA then
        C.close(fd)
        return nil, "arena " .. name .. " has an invalid size " .. size
    end
    return fd, size
end

-- The epoch in the shm object's control page, from a one-page mapping (cheap:
-- the once-a-second refresh must not map, let alone populate, the whole arena).
local function peek_epoch(fd)
    local page = C.mmap(nil, abi.C.ZCCP_CONTROL_SIZE, libc.PROT_READ_WRITE, libc.MAP_SHARED, fd, 0)
    if page == libc.MAP_FAILED then
        return nil
    end
    local ctl = ffi_cast(abi.control_ptr_t, page)
    local epoch = ctl.magic == abi.C.ZCCP_CONTROL_MAGIC and ctl.epoch or nil
    C.munmap(page, abi.C.ZCCP_CONTROL_SIZE)
    return epoch
end

-- Map the whole arena (pre-faulted) and validate its control page.
local function map_fd(name, fd, size, engine)
    local base = C.mmap(nil, size, libc.PROT_READ_WRITE, bor(libc.MAP_SHARED, libc.MAP_POPULATE), fd, 0)
    if base == libc.MAP_FAILED then
        return nil, "mmap " .. name .. ": " .. libc.errstr()
    end
    local ctl = ffi_cast(abi.control_ptr_t, base)
    local ok, err = validate_control(ctl, size)
    if not ok then
        C.munmap(base, size)
        return nil, err
    end
    return setmetatable({
        base = ffi_cast("uint8_t *", base),
        size = size,
        control = ctl,
        epoch = ctl.epoch,
        slot_count = tonumber(ctl.slot_count),
        slot_size = tonumber(ctl.slot_size),
        payload_offset = tonumber(ctl.payload_offset),
        payload_cap = tonumber(ctl.payload_cap),
        response_offset = tonumber(ctl.response_offset),
        response_cap = tonumber(ctl.response_cap),
        refs = 0,
        retired = false,
        engine = engine,   -- the engine's name (zccp.lib.slots keys its claims by it)
    }, mt)
end

-- Map `name` unless its epoch is `known_epoch`: returns the arena, or false when
-- unchanged, or nil, err.
local function map(name, known_epoch, engine)
    local fd, size = open_arena(name)
    if not fd then
        return nil, size
    end
    if known_epoch and peek_epoch(fd) == known_epoch then
        C.close(fd)
        return false
    end
    local a, err = map_fd(name, fd, size, engine)
    C.close(fd)
    return a, err
end

local function unmap(a)
    if a.base then
        C.munmap(a.base, a.size)
        a.base = nil
    end
end

-- Drop a superseded arena once no request holds it any more.
local function retire(a)
    a.retired = true
    if a.refs == 0 then
        unmap(a)
    end
end

local function live(a)
    return a and a.base and a.control.magic == abi.C.ZCCP_CONTROL_MAGIC and a.control.epoch == a.epoch
end

-- The arena of engine e for a new request (mapping or re-mapping as needed), with a
-- reference taken: call arena:release() when the request is done with it.
function _M.acquire(e)
    e = e or engines.list()[1]
    local a = current[e.name]
    if live(a) then
        a.refs = a.refs + 1
        return a
    end
    local fresh, err = map(e.shm_name, nil, e.name)
    if not fresh then
        return nil, err
    end
    if a then
        retire(a)
    end
    current[e.name] = fresh
    fresh.refs = 1
    return fresh
end

-- Re-open engine e's shm object and switch if the engine behind it changed (restart).
-- Returns true when the arena was replaced.
function _M.refresh(e)
    e = e or engines.list()[1]
    local a = current[e.name]
    local fresh = map(e.shm_name, a and a.epoch, e.name)
    if not fresh then
        return false
    end
    if a then
        retire(a)
    end
    current[e.name] = fresh
    return true
end

-- Every engine's refresh (the once-a-second timer, zccp.init).
function _M.refresh_all()
    for _, e in ipairs(engines.list()) do
        _M.refresh(e)
    end
end

-- Engine e's slot count as last mapped here, or nil (never mapped, or its engine gone):
-- zccp.plugins.router.route's load bound, without taking a reference.
function _M.slot_count(e)
    local a = current[e.name]
    return live(a) and a.slot_count or nil
end

function _M.release(self)
    self.refs = self.refs - 1
    if self.retired and self.refs == 0 then
        unmap(self)
    end
end

-- Engine e's purge epoch (a cdata uint64), or nil (no live arena, or not read yet).
local function epoch_of(e)
    local a = current[e.name]
    if live(a) then
        local v = a.control.purge_epoch
        if v ~= 0 then
            return v
        end
    end
    return nil
end

-- The cache's purge epoch the engines last read from Redis (a cdata uint64), or nil when
-- unknown (no arena, an engine that changed, Redis unreadable): nginx's L1 then answers
-- nothing. Several engines share one Redis: the highest any of them read (a purge any of
-- them saw empties L1 at once). Read from the control pages on every L1 lookup: loads
-- from shared memory.
function _M.purge_epoch()
    local list = engines.list()
    if #list == 1 then   -- one engine (the usual case): no loop on every L1 lookup
        return epoch_of(list[1])
    end
    local best
    for _, e in ipairs(list) do
        local v = epoch_of(e)
        if v and (not best or v > best) then
            best = v
        end
    end
    return best
end

-- The first engine's arena while it exports traces (its control page's trace_on), and its
-- sampling ratio in ppm; nil when it does not (zccp.plugins.l1.spans, on every L1 hit: two loads).
function _M.tracing()
    local a = current[engines.list()[1].name]
    if live(a) and a.control.trace_on == 1 then
        return a, a.control.trace_ratio_ppm
    end
    return nil
end

-- A pointer of type ptr_t at `offset` into slot i.
local function slot_at(self, i, offset, ptr_t)
    local p = ffi_cast(ptr_t, self.base + abi.C.ZCCP_PAGE_SIZE + i * self.slot_size + offset)
    return p
end

function _M.header(self, i)
    return slot_at(self, i, 0, abi.header_ptr_t)
end

function _M.meta(self, i)
    return slot_at(self, i, abi.C.ZCCP_SLOT_META_OFFSET, abi.meta_ptr_t)
end

function _M.signature(self, i)
    return slot_at(self, i, abi.C.ZCCP_SLOT_SIG_OFFSET, abi.signature_ptr_t)
end

function _M.request(self, i)
    return slot_at(self, i, abi.C.ZCCP_SLOT_REQ_OFFSET, abi.request_ptr_t)
end

function _M.payload_ptr(self, i)
    return self.base + abi.C.ZCCP_PAGE_SIZE + i * self.slot_size + self.payload_offset
end

function _M.response_ptr(self, i)
    return self.base + abi.C.ZCCP_PAGE_SIZE + i * self.slot_size + self.response_offset
end

return _M
