"""Variant B: FastAPI on uvicorn, behind nginx proxy_pass (upstream keepalive).

    uvicorn bench.apps.fastapi_app:app --workers N
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool

from bench.apps import common

app = FastAPI()


@app.post("/v1/messages")
async def messages(request: Request) -> Response:
    body = await request.body()
    if common.INLINE:
        status, data, sse = common.handle(body)
    else:
        status, data, sse = await run_in_threadpool(common.handle, body)
    if sse:
        it = data if common.INLINE else iterate_in_threadpool(data)
        return StreamingResponse(it, status_code=status, media_type="text/event-stream; charset=utf-8",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return Response(data, status_code=status, media_type="application/json")


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}
