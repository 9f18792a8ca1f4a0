local _M = { name = "noop2" }
function _M.prepare() end
return _M
