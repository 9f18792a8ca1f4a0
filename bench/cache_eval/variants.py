"""Labelled variants of a base prompt, one generator per category.

Each generator takes (rng, text) and returns (kind, base_text, variant_text): the base may
itself be changed (the mask categories plant a value in it), the variant is what the
second request sends. Only the text changes here; parameters are varied in run.py.
"""

from __future__ import annotations

import random
import re
import string
import uuid

# ----------------------------------------------------------------------------- mask targets

_LETTERS = string.ascii_uppercase


def _long_id(rng: random.Random) -> str:
    """Matches only the `long_id` mask: \\b[A-Za-z]{0,3}\\d{7,}\\b, never an epoch (1 + 9 or 12 digits)."""
    prefix = "".join(rng.choice(_LETTERS) for _ in range(rng.randint(0, 3)))
    n = rng.randint(7, 12)
    first = rng.choice("23456789") if not prefix else rng.choice(string.digits)
    return prefix + first + "".join(rng.choice(string.digits) for _ in range(n - 1))


def _uuid(rng: random.Random) -> str:
    u = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return u.upper() if rng.random() < 0.2 else u


def _iso(rng: random.Random) -> str:
    y, mo, d = rng.randint(2000, 2035), rng.randint(1, 12), rng.randint(1, 28)
    h, mi, s = rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59)
    date = f"{y:04d}-{mo:02d}-{d:02d}"
    sep = rng.choice("T ")
    form = rng.randrange(5)
    if form == 0:
        return f"{date}{sep}{h:02d}:{mi:02d}"
    if form == 1:
        return f"{date}{sep}{h:02d}:{mi:02d}:{s:02d}Z"
    if form == 2:
        return f"{date}{sep}{h:02d}:{mi:02d}:{s:02d}.{rng.randint(0, 999):03d}+{rng.randint(0, 12):02d}:00"
    if form == 3:
        return f"{date}T{h:02d}:{mi:02d}:{s:02d}-0{rng.randint(1, 9)}00"
    return f"{date}{sep}{h:02d}:{mi:02d}:{s:02d},{rng.randint(0, 999999):06d}"


def _epoch_s(rng: random.Random) -> str:
    return str(rng.randint(1_000_000_000, 1_999_999_999))


def _epoch_ms(rng: random.Random) -> str:
    return str(rng.randint(1_000_000_000_000, 1_999_999_999_999))


_NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory", "oscar",
          "peggy", "rupert", "sybil", "trent", "victor", "walter", "yuki", "zoe"]
_DOMAINS = ["example.com", "mail.example.org", "corp.example.co.uk", "uni.example.edu", "example.io",
            "dept.example.net"]


def _email(rng: random.Random) -> str:
    user = rng.choice(_NAMES)
    form = rng.randrange(4)
    if form == 1:
        user += "." + rng.choice(_NAMES)
    elif form == 2:
        user += str(rng.randint(1, 9999))
    elif form == 3:
        user += "+" + rng.choice(["news", "billing", "x", "tag42"])
    return f"{user}@{rng.choice(_DOMAINS)}"


_ID_TEMPLATES = ["Ticket {v}: ", "[request {v}]\n", "\n\nReference number: {v}", " (case {v})", "\nSession id {v}\n"]
_TS_TEMPLATES = ["Sent at {v}.\n", "[{v}] ", "\n\nTimestamp: {v}", " (as of {v})", "\nLast updated {v}\n"]
_EMAIL_TEMPLATES = ["From: {v}\n", "Reply to {v}. ", "\n\nContact: {v}", " (cc {v})", "\nUser {v} asks:\n"]


def _plant(rng: random.Random, text: str, templates: list[str], a: str, b: str) -> tuple[str, str]:
    """The same template at the same place, once with value a and once with b."""
    t = rng.choice(templates)
    where = rng.randrange(3)   # 0 start, 1 end, 2 after the first sentence/line
    if where == 0:
        pos = 0
    elif where == 1:
        pos = len(text)
    else:
        m = re.search(r"[.!?\n]\s", text)
        pos = m.end() if m else len(text)

    def put(v: str) -> str:
        ins = t.format(v=v)
        if pos < len(text) and not ins[-1].isspace():
            ins += " "            # never glue the value to the next word (that defeats the mask's \b)
        if pos > 0 and not ins[0].isspace() and not text[pos - 1].isspace():
            ins = " " + ins
        return text[:pos] + ins + text[pos:]
    return put(a), put(b)


def mask_id(rng, text):
    kind = rng.choice(["long_id", "uuid", "long_id+uuid"])
    if kind == "long_id":
        return (kind, *_plant(rng, text, _ID_TEMPLATES, _long_id(rng), _long_id(rng)))
    if kind == "uuid":
        return (kind, *_plant(rng, text, _ID_TEMPLATES, _uuid(rng), _uuid(rng)))
    a1, b1 = _plant(rng, text, _ID_TEMPLATES, _long_id(rng), _long_id(rng))
    tmpl = "\nTrace {v}"
    u1, u2 = _uuid(rng), _uuid(rng)
    return kind, a1 + tmpl.format(v=u1), b1 + tmpl.format(v=u2)


def mask_timestamp(rng, text):
    kind = rng.choice(["iso8601", "epoch_seconds", "epoch_millis"])
    gen = {"iso8601": _iso, "epoch_seconds": _epoch_s, "epoch_millis": _epoch_ms}[kind]
    return (kind, *_plant(rng, text, _TS_TEMPLATES, gen(rng), gen(rng)))


def mask_email(rng, text):
    a = _email(rng)
    b = _email(rng)
    while b == a:
        b = _email(rng)
    return ("email", *_plant(rng, text, _EMAIL_TEMPLATES, a, b))


# ----------------------------------------------------------------------------- formatting changes

def whitespace(rng, text):
    kind = rng.choice(["double_spaces", "newlines_to_spaces", "trailing", "leading", "tabs", "crlf", "indent"])
    if kind == "double_spaces":
        spaces = [m.start() for m in re.finditer(" ", text)]
        if spaces:
            pick = set(rng.sample(spaces, max(1, len(spaces) // 5)))
            return kind, text, "".join(c + (" " if i in pick else "") for i, c in enumerate(text))
        kind = "trailing"
    if kind == "newlines_to_spaces":
        if "\n" in text:
            return kind, text, re.sub(r"\s*\n\s*", " ", text)
        return "spaces_to_newlines", text, text.replace(". ", ".\n\n")if ". " in text else text + "\n"
    if kind == "trailing":
        return kind, text, text + rng.choice(["\n", "  ", "\n\n", " \n"])
    if kind == "leading":
        return kind, text, rng.choice(["\n", "  ", "\t"]) + text
    if kind == "tabs":
        return kind, text, re.sub(r" {1,4}", "\t", text,
                                  count=max(1, text.count(" ") // 3)) if " " in text else text + "\t"
    if kind == "crlf":
        return kind, text, text.replace("\n", "\r\n") if "\n" in text else text + "\r\n"
    return kind, text, "\n".join("    " + line for line in text.split("\n"))


_PUNCT_SWAP = {".": "!", ",": ";", "?": "?!", "!": ".", ";": ",", ":": " -"}


def punctuation(rng, text):
    kind = rng.choice(["end_mark", "swap_marks", "drop_commas", "quote_word", "ellipsis", "add_commas"])
    if kind == "end_mark":
        t = text.rstrip()
        if t and t[-1] in ".?!":
            return kind, text, t[:-1]
        return kind, text, t + rng.choice(["?", ".", "!", "!!"])
    if kind == "swap_marks":
        # only marks followed by whitespace or the end: never joins two words
        pat = re.compile(r"[.,?!;:](?=\s|$)")
        if pat.search(text):
            return kind, text, pat.sub(lambda m: _PUNCT_SWAP[m.group()], text)
        kind = "quote_word"
    if kind == "drop_commas":
        if re.search(r",(?=\s)", text):
            return kind, text, re.sub(r",(?=\s)", "", text)
        kind = "add_commas"
    if kind == "ellipsis":
        return kind, text, text.rstrip() + "..."
    if kind == "add_commas":
        spaces = [m.start() for m in re.finditer(r"(?<=\w) ", text)]
        if spaces:
            pick = set(rng.sample(spaces, max(1, len(spaces) // 8)))
            return kind, text, "".join(("," if i in pick else "") + c for i, c in enumerate(text))
        return kind, text, text + ","
    words = list(re.finditer(r"(?<!\S)[A-Za-z]+(?!\S)", text))
    if words:
        w = rng.choice(words)
        return "quote_word", text, text[:w.start()] + '"' + w.group() + '"' + text[w.end():]
    return "quote_text", text, '"' + text + '"'


def case(rng, text):
    kind = rng.choice(["lower", "upper", "capitalize_sentences", "title_words", "swapcase_words"])
    if kind == "lower":
        v = text.lower()
    elif kind == "upper":
        v = text.upper()
    elif kind == "capitalize_sentences":
        v = re.sub(r"(^|[.!?]\s+)(\w)", lambda m: m.group(1) + m.group(2).upper(), text.lower())
    elif kind == "title_words":
        v = re.sub(r"\b(\w)(\w*)", lambda m: m.group(1).upper() + m.group(2), text)
    else:
        v = re.sub(r"\w+", lambda m: m.group().swapcase() if rng.random() < 0.3 else m.group(), text)
    if v == text:   # nothing to change (no letters, or already so): upper-case it
        kind, v = "upper", text.upper()
    return kind, text, v


# ----------------------------------------------------------------------------- content changes

_VOCAB = ("banana orchestra granite velvet compass lantern meadow quartz harbor saffron tundra violin "
          "walnut zephyr cobalt ember falcon glacier hammock indigo juniper kettle lagoon marble nectar "
          "obsidian pepper quiver raven sorrel thimble umber vortex willow yonder").split()

_WORD = re.compile(r"\w+")


def one_word_edit(rng, text):
    words = list(_WORD.finditer(text))
    kind = rng.choice(["substitute", "delete", "insert"])
    new = rng.choice([w for w in _VOCAB if w not in text.lower()] or _VOCAB)
    if not words:
        return "insert", text, text + " " + new
    w = rng.choice(words)
    if kind == "substitute":
        return kind, text, text[:w.start()] + new + text[w.end():]
    if kind == "delete" and len(words) > 1:
        # the word and the whitespace after it
        end = w.end()
        while end < len(text) and text[end] == " ":
            end += 1
        return kind, text, text[:w.start()] + text[end:]
    return "insert", text, text[:w.start()] + new + " " + text[w.start():]


_SENTENCES = [
    "Please keep the answer short.", "Thanks in advance!", "Explain it step by step.",
    "Answer in plain English, without jargon.", "Give me three examples.", "Use bullet points.",
    "I need this for a presentation tomorrow.", "Can you also cite your sources?",
    "Write it in a friendly tone.", "Make it suitable for beginners.", "Be concise.",
    "Please double-check your answer before replying.", "Format the result as a table.",
    "Assume I already know the basics.", "Respond in under one hundred words.",
    "Include a short summary at the end.", "What would you recommend?", "Keep it professional.",
]


def appended_sentence(rng, text):
    s = rng.choice(_SENTENCES)
    sep = rng.choice([" ", "\n", "\n\n"])
    return ("append_" + ("space" if sep == " " else "newline"), text, text + sep + s)


def long_edit(rng, text, window_end_char: int, after: bool):
    """For > 1024-token prompts: one word substituted after the fingerprint's window (the
    fingerprints of base and variant are then identical, only the exact key differs) or
    inside it (in the first 1024 tokens)."""
    words = list(_WORD.finditer(text))
    new = rng.choice(_VOCAB)
    if after:
        late = [w for w in words if w.start() > window_end_char]
        if late:
            w = rng.choice(late)
            return "edit_after_window", text, text[:w.start()] + new + text[w.end():]
    early = [w for w in words if w.end() < window_end_char // 2] or words[:1]
    w = rng.choice(early)
    return "edit_in_window", text, text[:w.start()] + new + text[w.end():]


TEXT_CATEGORIES = {
    "mask_id": mask_id,
    "mask_timestamp": mask_timestamp,
    "mask_email": mask_email,
    "whitespace": whitespace,
    "punctuation": punctuation,
    "case": case,
    "one_word_edit": one_word_edit,
    "appended_sentence": appended_sentence,
}
