-- The shared-memory ABI: shm_abi/zccp_abi.h handed to ffi.cdef unchanged.
-- Constants come from the header's enums; sizes the header promises are asserted.
local ffi = require "ffi"
local settings = require "zccp.settings"

local io_open = io.open
local error = error
local ipairs = ipairs
local tostring = tostring
local package = package

local _M = { _VERSION = "0.1.0" }

local loaded = false

-- shm_abi/zccp_abi.h beside the Lua tree (<root>/lua/zccp/lib/abi.lua -> <root>/shm_abi/),
-- in a checkout and in the installed share/zccp alike.
local function default_header()
    local me = package.searchpath and package.searchpath("zccp.lib.abi", package.path)
    if not me then
        return nil
    end
    return (me:gsub("lua/zccp/lib/abi%.lua$", "shm_abi/zccp_abi.h"))
end

local function load_header(path)
    local f, err = io_open(path, "rb")
    if not f then
        error("zccp.lib.abi: cannot open ABI header " .. path .. ": " .. tostring(err), 3)
    end
    local src = f:read("*a")
    f:close()
    ffi.cdef(src)
end

-- Load once per VM (ffi.cdef cannot redeclare types). Called from init_by_lua with the
-- configured header; modules that only need the constants call it without one.
function _M.init(path)
    if loaded then
        return _M
    end
    path = path or settings.abi_header() or default_header()
    if not path then
        error("zccp.lib.abi: no ABI header path and zccp/lib/abi.lua is not on package.path", 2)
    end
    load_header(path)
    local C = ffi.C
    for _, pair in ipairs {
        { "struct zccp_control", "ZCCP_CONTROL_SIZE" },
        { "struct zccp_slot_header", "ZCCP_SLOT_HEADER_SIZE" },
        { "struct zccp_slot_meta", "ZCCP_SLOT_META_SIZE" },
        { "struct zccp_slot_signature", "ZCCP_SLOT_SIG_SIZE" },
        { "struct zccp_slot_request", "ZCCP_SLOT_REQ_SIZE" },
        { "struct zccp_ring", "ZCCP_RING_SIZE" },
        { "struct zccp_notice", "ZCCP_NOTICE_SIZE" },
    } do
        if ffi.sizeof(pair[1]) ~= C[pair[2]] then
            error("zccp.lib.abi: ABI mismatch: sizeof(" .. pair[1] .. ") ~= " .. pair[2], 2)
        end
    end
    if ffi.offsetof("struct zccp_slot_header", "deadline_ns") + 8 ~= C.ZCCP_SLOT_META_OFFSET then
        error("zccp.lib.abi: ABI mismatch: meta block must follow the header", 2)
    end
    if C.ZCCP_SLOT_META_OFFSET + C.ZCCP_SLOT_META_SIZE ~= C.ZCCP_SLOT_SIG_OFFSET then
        error("zccp.lib.abi: ABI mismatch: signature must follow the meta block", 2)
    end
    if C.ZCCP_SLOT_SIG_OFFSET + C.ZCCP_SLOT_SIG_SIZE ~= C.ZCCP_SLOT_REQ_OFFSET
       or C.ZCCP_SLOT_REQ_OFFSET + C.ZCCP_SLOT_REQ_SIZE > C.ZCCP_PAGE_SIZE then
        error("zccp.lib.abi: ABI mismatch: the request block must follow the signature, in the first page", 2)
    end
    _M.C = C
    _M.control_ptr_t = ffi.typeof("struct zccp_control *")
    _M.header_ptr_t = ffi.typeof("struct zccp_slot_header *")
    _M.meta_ptr_t = ffi.typeof("struct zccp_slot_meta *")
    _M.signature_ptr_t = ffi.typeof("struct zccp_slot_signature *")
    _M.request_ptr_t = ffi.typeof("struct zccp_slot_request *")
    _M.ring_t = ffi.typeof("struct zccp_ring")
    _M.notice_ptr_t = ffi.typeof("const struct zccp_notice *")
    loaded = true
    return _M
end

return _M
