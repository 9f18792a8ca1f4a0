-- Constants and code point classes of the content-similarity fingerprint (CSF).
-- The ONE source of these values: lua/zccp/fp/*.lua require this file and
-- engine/zccp/cache/fp/tables.py parses it (a literal table: numbers, strings, tables only).
-- Specification: docs/fingerprint.md. Changing anything here changes every key:
-- bump `version` and regenerate shm_abi/vectors/fingerprint_vectors.json.
return {
    version = 3,
    max_tokens = 1024,       -- the CSF looks at the first 1024 tokens of the final user turn
    -- MinHash bins and LSH bands: ZCCP_MINHASH_COUNT (a power of two) and ZCCP_CSF_BANDS
    -- of the ABI header (the slot holds the signature and the band keys), 8 rows per band.
    seed_hi = 0x5A434350,    -- 64-bit seed 0x5A43435046503032 ("ZCCPFP02"): the shingle
    seed_lo = 0x46503032,    -- mixer's key and the splitmix64 seed of the probe table
    decode_limit = 65536,    -- nginx fingerprints bodies of at most this many bytes
    max_depth = 128,         -- JSON nested deeper: no fingerprint (lua-cjson's decode_max_depth)
    exact_prefix = "zccp-exact/3\n",    -- first bytes hashed for the exact key
    prefix_prefix = "zccp-prefix/3\n",  -- first bytes hashed for the prefix key
    -- members a near-duplicate final user turn may have (anything else: exact-only),
    -- and the members of its text blocks
    turn_keys = { "role", "content" },
    text_block_keys = { "type", "text", "cache_control" },
    -- top-level members the exact key leaves out: they never change the answer
    excluded_keys = { "stream", "stream_options", "metadata", "user" },
    -- masks rewrite the strings that are the value of members with these names
    masked_keys = { "content", "text" },

    -- Non-ASCII code point classes: sorted, non-overlapping, inclusive ranges.
    -- "S": separator (ends a word, is not part of any token).
    -- "C": CJK ideograph / kana / hangul: each code point is a token of its own.
    -- Every other non-ASCII code point (and every byte of invalid UTF-8) is a word byte.
    ranges = {
        { 0x0080, 0x00BF, "S" },   -- C1 controls, NBSP, Latin-1 punctuation and symbols
        { 0x00D7, 0x00D7, "S" },   -- multiplication sign
        { 0x00F7, 0x00F7, "S" },   -- division sign
        { 0x037E, 0x037E, "S" },   -- Greek question mark
        { 0x0387, 0x0387, "S" },   -- Greek ano teleia
        { 0x055A, 0x055F, "S" },   -- Armenian punctuation
        { 0x0589, 0x058A, "S" },   -- Armenian full stop, hyphen
        { 0x05BE, 0x05BE, "S" },   -- Hebrew maqaf
        { 0x05C0, 0x05C0, "S" },   -- Hebrew paseq
        { 0x05C3, 0x05C3, "S" },   -- Hebrew sof pasuq
        { 0x05F3, 0x05F4, "S" },   -- Hebrew geresh, gershayim
        { 0x060C, 0x060D, "S" },   -- Arabic comma, date separator
        { 0x061B, 0x061B, "S" },   -- Arabic semicolon
        { 0x061D, 0x061F, "S" },   -- Arabic end of text mark, triple dot, question mark
        { 0x066A, 0x066D, "S" },   -- Arabic percent, decimal/thousands separators, star
        { 0x06D4, 0x06D4, "S" },   -- Arabic full stop
        { 0x0964, 0x0965, "S" },   -- Devanagari danda, double danda
        { 0x0E4F, 0x0E4F, "S" },   -- Thai fongman
        { 0x0E5A, 0x0E5B, "S" },   -- Thai angkhankhu, khomut
        { 0x1100, 0x11FF, "C" },   -- Hangul Jamo
        { 0x1680, 0x1680, "S" },   -- Ogham space mark
        { 0x180E, 0x180E, "S" },   -- Mongolian vowel separator
        { 0x2000, 0x206F, "S" },   -- General Punctuation (spaces, dashes, quotes, ZW*, ...)
        { 0x20A0, 0x20CF, "S" },   -- Currency Symbols
        { 0x2190, 0x2BFF, "S" },   -- arrows, math operators, technical, box drawing,
                                   -- shapes, misc symbols, dingbats, ... (incl. emoji)
        { 0x2E00, 0x2E7F, "S" },   -- Supplemental Punctuation
        { 0x2E80, 0x2FDF, "C" },   -- CJK Radicals Supplement, Kangxi Radicals
        { 0x2FF0, 0x2FFF, "S" },   -- Ideographic Description Characters
        { 0x3000, 0x303F, "S" },   -- CJK Symbols and Punctuation (ideographic space, 、。「」)
        { 0x3040, 0x30FF, "C" },   -- Hiragana, Katakana
        { 0x3100, 0x312F, "C" },   -- Bopomofo
        { 0x3130, 0x318F, "C" },   -- Hangul Compatibility Jamo
        { 0x31A0, 0x31BF, "C" },   -- Bopomofo Extended
        { 0x31F0, 0x31FF, "C" },   -- Katakana Phonetic Extensions
        { 0x3400, 0x4DBF, "C" },   -- CJK Unified Ideographs Extension A
        { 0x4E00, 0x9FFF, "C" },   -- CJK Unified Ideographs
        { 0xA960, 0xA97F, "C" },   -- Hangul Jamo Extended-A
        { 0xAC00, 0xD7FF, "C" },   -- Hangul Syllables, Hangul Jamo Extended-B
        { 0xF900, 0xFAFF, "C" },   -- CJK Compatibility Ideographs
        { 0xFE00, 0xFE1F, "S" },   -- Variation Selectors, Vertical Forms
        { 0xFE30, 0xFE6F, "S" },   -- CJK Compatibility Forms, Small Form Variants
        { 0xFEFF, 0xFEFF, "S" },   -- zero width no-break space (BOM)
        { 0xFF00, 0xFF0F, "S" },   -- fullwidth ! " # ... /
        { 0xFF1A, 0xFF20, "S" },   -- fullwidth : ; < = > ? @
        { 0xFF3B, 0xFF40, "S" },   -- fullwidth [ \ ] ^ _ `
        { 0xFF5B, 0xFF65, "S" },   -- fullwidth { | } ~, halfwidth CJK punctuation
        { 0xFF66, 0xFFDC, "C" },   -- Halfwidth Katakana, Halfwidth Hangul
        { 0xFFE0, 0xFFEE, "S" },   -- fullwidth/halfwidth symbols
        { 0xFFF0, 0xFFFF, "S" },   -- Specials (incl. U+FFFD replacement character)
        { 0x1B000, 0x1B16F, "C" }, -- Kana Supplement, Kana Extended-A, Small Kana Extension
        { 0x1F000, 0x1FAFF, "S" }, -- Mahjong, cards, enclosed, emoji, pictographs, ...
        { 0x20000, 0x2FA1F, "C" }, -- CJK Extensions B-F, Compatibility Ideographs Supplement
        { 0x30000, 0x323AF, "C" }, -- CJK Extensions G, H
        { 0xE0000, 0xE007F, "S" }, -- Tags (emoji flag sequences)
    },
}
