-- luacheck for lua/ (scripts/lint.sh): OpenResty's globals, LuaJIT's standard library.
std = "ngx_lua"
max_line_length = false
exclude_files = { ".venv/**", ".run/**" }
