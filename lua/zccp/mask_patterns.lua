-- ZCCP mask patterns: the ONE list of masks (operators edit this file).
--
-- Masks rewrite volatile values (IDs, timestamps, e-mail addresses) in the prompt
-- text before any cache key or fingerprint is computed, so that two requests that
-- differ only in such values share cache entries. They never change what the model
-- sees. Applied in order, each to the result of the previous one.
--
--   name         a unique name; errors are reported by it
--   pattern      a PCRE pattern, run as ngx.re.gsub(text, pattern, replacement, "jo"):
--                byte mode (no UTF-8 flag), no other flags; use (?i) etc. inline.
--                \d \w \b are ASCII-only.
--   replacement  ngx.re template: $0 the match, $1 or ${1} a group, $$ a dollar sign.
--   prefilter    optional, speed only: a list of regexes that every match of `pattern`
--                contains. When one of them finds nothing in a string, the gsub is
--                skipped there. Keep each a provable necessary condition, and edit it
--                with its pattern (a wrong prefilter silently skips real matches).
--
-- Write patterns in long brackets [[...]] (Lua "..." strings reject "\d"). This file
-- must stay a literal table (no variables, no `..`): the engine reads it with a
-- literal parser. After editing: `zccp-stack reload --config ... --run-dir ...` (README,
-- "Operating the stack"; an nginx you run yourself: `nginx -s reload`,
-- docs/existing-nginx.md). A pattern that fails to compile is logged by name and the
-- previous good version of that pattern stays in force (docs/fingerprint.md, "Masks").
return {
    {
        name = "uuid",
        pattern = [[\b[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}\b]],
        replacement = "<uuid>",
        prefilter = { [[-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-]] },   -- "-hhhh-hhhh-hhhh-"
    },
    {
        -- 2024-05-01T12:30:00Z, 2024-05-01 12:30, 2024-05-01T12:30:00.123+02:00
        name = "iso8601",
        pattern = [[\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}(?::?\d{2})?)?(?!\w)]],
        replacement = "<timestamp>",
        prefilter = { [[-\d\d-\d\d[T ]\d\d:\d\d]] },
    },
    {
        name = "email",
        pattern = [[\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b]],
        replacement = "<email>",
        prefilter = { [[@[A-Za-z0-9-]+\.]] },   -- "@", the first domain label, "."
    },
    {
        -- Unix epoch milliseconds 2001-09-09 .. 2033-05-18
        name = "epoch_millis",
        pattern = [[\b1\d{12}\b]],
        replacement = "<epoch_ms>",
        prefilter = { [[\d{7}]], [[1\d{12}]] },   -- \d{7} is shared: searched once per string
    },
    {
        -- Unix epoch seconds 2001-09-09 .. 2033-05-18
        name = "epoch_seconds",
        pattern = [[\b1\d{9}\b]],
        replacement = "<epoch>",
        prefilter = { [[\d{7}]], [[1\d{9}]] },
    },
    {
        -- long numeric IDs with an optional short letter prefix: P123456789, 12345678
        name = "long_id",
        pattern = [[\b[A-Za-z]{0,3}\d{7,}\b]],
        replacement = "<id>",
        prefilter = { [[\d{7}]] },
    },
}
