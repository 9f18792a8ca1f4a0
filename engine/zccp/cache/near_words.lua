-- The words of the near-duplicate check (docs/cache.md, "What a NEAR means"): the ONE list.
-- The engine reads it with the literal reader (zccp.cache.meaning) when it starts; nginx
-- does not need it today. Keep it a literal table: strings and tables only. Edit, then
-- restart the engine (an edit changes the near index's namespace: stored near records
-- are not found again until they are stored anew; exact hits are unaffected).
--
-- Two final user turns are one NEAR only when their *units* are the same sequence once
-- the filler below is set aside. Units: the words (case-folded, Unicode NFC), and every
-- symbol that can carry meaning (+ - * / = < > % $ € # & | ~ ^ @ [ ] { } _ \ ` and every
-- non-ASCII symbol), digits' neighbours included. Whitespace, letter case, prose
-- punctuation (below) and the values the masks replaced (both turns carry the same
-- placeholder) are not units. So ANY other word, number, symbol or order differs.
--
-- A phrase is matched on units (write it in lower case, words separated by a space). A
-- phrase that holds a protected word (below) or a digit is refused when the list is read.
return {
    -- set aside wherever they stand: they only ask nicely
    filler_anywhere = { "please", "pls", "plz" },

    -- set aside at the very start of the turn (repeatedly: "hi, could you kindly ...")
    filler_start = {
        "hi", "hello", "hey", "hi there", "hello there", "hey there", "greetings", "dear",
        "good morning", "good afternoon", "good evening",
        "can you", "could you", "would you", "will you", "can u", "could u",
        "would you mind", "kindly", "i was wondering if you could",
    },

    -- set aside at the very end of the turn (repeatedly: "... thanks in advance, cheers")
    filler_end = {
        "thanks", "thank you", "thanks a lot", "thanks in advance", "thx", "ty", "cheers",
    },

    -- Prose punctuation besides ASCII . , ; : ! ? ' " ( ) - : not units, except next to a
    -- digit (1.5, 10:30, 5'), a hyphen that does not join two letters (-5, --flag, 3-4; but
    -- hyphens standing alone between words are a dash, "a - b", unless between numbers, "5 - 3")
    -- or an ! before a word or = (!done, !=).
    prose_punctuation = "“”‘’«»„‚‹›—–‐‑‒…、。，．：；！？¡¿（）「」『』【】《》〈〉·",

    -- Protected words: never filler (a filler phrase holding one is refused). A turn that
    -- differs from another in one of them differs in a unit anyway: this list documents
    -- what the rule protects, and guards the filler lists against an unsafe edit.
    negations = {
        "not", "no", "never", "none", "nothing", "nobody", "nowhere", "neither", "nor",
        "without", "cannot", "cant", "dont", "doesnt", "isnt", "arent", "wont", "t",
    },
    quantifiers = {
        "all", "every", "each", "some", "any", "few", "many", "much", "most", "several",
        "both", "either", "only", "just", "least", "half", "once", "twice", "double",
    },
    comparisons = {
        "more", "less", "fewer", "than", "greater", "smaller", "larger", "bigger", "higher",
        "lower", "better", "worse", "best", "worst", "before", "after", "above", "below",
        "over", "under", "max", "min", "maximum", "minimum", "equal", "same", "different",
    },
}
