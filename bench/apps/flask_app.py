"""Variant C: Flask on gunicorn sync workers, behind nginx proxy_pass (the seed's old architecture).

    gunicorn -k sync -w N bench.apps.flask_app:app
"""

from __future__ import annotations

from flask import Flask, Response, request

from bench.apps import common

app = Flask(__name__)


@app.post("/v1/messages")
def messages() -> Response:
    body = request.get_data(cache=False)
    status, data, sse = common.handle(body)
    if sse:
        return Response(data, status=status, mimetype="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return Response(data, status=status, mimetype="application/json")


@app.get("/health")
def health() -> Response:
    return Response(b'{"status":"ok"}', mimetype="application/json")
