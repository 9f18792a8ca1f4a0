"""Variant B-cache: B (FastAPI on uvicorn behind nginx) with an exact Redis cache in front of
the same work: what teams build instead of ZCCP's cache.

The key is ZCCP's exact key (its masks and canonical form, computed by zccp.cache's own
Python on the one parse), the entry ZCCP's CachedAnswer, the client redis-py's asyncio one
(hiredis), and a hit is rendered with a fresh response id as ZCCP replays it. The request is
validated and tokenized before the lookup, as in ZCCP's engine (usage needs the token count).
Streamed requests are answered uncached (the benchmark's workloads are not streamed).

    uvicorn bench.apps.fastapi_cache_app:app --workers N     (ZCCP_BENCH_REDIS_URL set)
"""

from __future__ import annotations

import os
import time

import redis.asyncio as aioredis
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from bench.apps import common
from bench.apps.fastapi_app import messages as uncached
from zccp.api import anthropic
from zccp.cache.answer import CachedAnswer
from zccp.cache.fp.canonical import exact_key
from zccp.cache.mask_apply import mask_doc
from zccp.cache.mask_store import load_masks
from zccp.shared_types import ApiError, Completed

PREFIX = "bench:bcache:e:"
TTL_S = 3600
MASKS = load_masks()
REDIS = aioredis.Redis.from_url(os.environ["ZCCP_BENCH_REDIS_URL"])

app = FastAPI()


@app.post("/v1/messages")
async def messages(request: Request) -> Response:
    body = await request.body()
    try:
        doc = anthropic.decode_body(body)
        p = common.prepare_doc(doc)
    except ApiError as err:
        status, data = common.error_reply(err)
        return Response(data, status_code=status, media_type="application/json")
    if p.req.stream:
        p.release()
        return await uncached(request)
    mask_doc(doc, MASKS)   # after parsing: the request keeps the unmasked text
    key = PREFIX + exact_key("anthropic", doc).hex()
    cc = request.headers.get("cache-control", "")
    if "no-cache" not in cc:
        raw = await REDIS.get(key)
        hit = CachedAnswer.from_json(raw) if raw is not None else None
        if hit is not None:
            result = hit.result(int(p.input_ids.numel()))
            p.release()
            data = anthropic.render_response(p.req, result, anthropic.new_response_id(), int(time.time()))
            return Response(data, media_type="application/json", headers={"X-Cache": "HIT"})
    if common.INLINE:
        data, result = common.complete_with_result(p)
    else:
        data, result = await run_in_threadpool(common.complete_with_result, p)
    if "no-store" not in cc:
        entry = CachedAnswer.of(Completed(result, (len(result.text),) if result.text else ()), time.time())
        await REDIS.set(key, entry.to_json(), ex=TTL_S)
    return Response(data, media_type="application/json", headers={"X-Cache": "MISS"})


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}
