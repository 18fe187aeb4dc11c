"""The web page at / (frontend/static/index.html) and the small JSON it polls, GET /stats.

The page is one static file, no build step and nothing fetched from elsewhere: a chat
playground that streams through /v1/chat/completions (or /v1/completions in raw mode),
and an engine panel that reads /stats about once a second. Its Stop button aborts the
fetch; the closed connection is a client disconnect, which the engine client turns into
an AbortRequest to the scheduler, as for any other client.

/stats is cheap: it only reads what the frontend already holds, the scheduler's latest
EngineStatus (sent with every heartbeat, about once a second) and the metrics registry:

    {"time": <unix s>,
     "replicas": [{"id": "0", "model", "alive", "status_age_s", "device", "gpus",
                   "num_requests_running", "num_requests_waiting", "num_requests_in_flight",
                   "kv_cache_usage", "kv_cache_free_blocks", "kv_cache_total_blocks",
                   "prefix_cache_queries", "prefix_cache_hits", "prefix_cache_hit_rate",
                   "output_tokens_per_s", "output_tokens_total", "spec_method",
                   "spec_draft_tokens", "spec_accepted_tokens", "spec_acceptance_rate"}],
     "totals": {the counts summed over replicas, "kv_cache_usage" and "prefix_cache_hit_rate"
                over them all, "num_replicas", "num_replicas_alive"}}

One entry per scheduler replica the frontend has admitted (frontend.cluster's table), by
id; the in-flight and token counts are what the frontend routed there. Figures the
frontend has not heard yet are null. `output_tokens_per_s` is over the last RATE_WINDOW_S;
`prefix_cache_hit_rate` is hits / queries (in tokens) since the scheduler started;
`spec_acceptance_rate` accepted / drafted tokens (speculative decoding), null without.
Like /health and /metrics, /stats needs no API key: it holds the same numbers as /metrics
and no request content. With server.ui off, / is a 404 (and /stats stays).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse

from common.config import Config
from frontend.cluster.engine_client import EngineClient
from frontend.frontends import own_figures
from frontend.metrics import Metrics

PAGE = Path(__file__).parent / "static" / "index.html"
# the page loads nothing from elsewhere; the browser holds it to that
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:",
    "Cache-Control": "no-cache",
}
SUMMED = (
    "num_requests_running",
    "num_requests_waiting",
    "num_requests_in_flight",
    "kv_cache_free_blocks",
    "kv_cache_total_blocks",
    "output_tokens_per_s",
    "output_tokens_total",
)


def replica_stats(
    config: Config, client: EngineClient, metrics: Metrics, replica: int = 0
) -> dict[str, Any]:
    now = time.monotonic()
    cluster = client.cluster
    engine = cluster.engines().get(replica)
    seen = cluster.last_seen(f"scheduler.{replica}")
    # this frontend's own figures, plus the other frontends' (several on the port)
    mine = own_figures(client.num_open, metrics, now)
    in_flight, total, rate = mine.get(replica, [0, 0, 0.0])
    if client.peers is not None:
        more = client.peers.others().get(replica, [0, 0, 0.0])
        in_flight, total, rate = in_flight + more[0], total + more[1], rate + more[2]
    out: dict[str, Any] = {
        "id": str(replica),
        "model": config.model_name,
        "alive": cluster.alive(f"scheduler.{replica}", now),
        "status_age_s": None if seen is None else round(now - seen, 3),
        "num_requests_in_flight": int(in_flight),
        "output_tokens_per_s": round(rate, 2),
        "output_tokens_total": int(total),
    }
    if engine is None:
        out.update(
            dict.fromkeys(
                (
                    "num_requests_running",
                    "num_requests_waiting",
                    "kv_cache_usage",
                    "kv_cache_free_blocks",
                    "kv_cache_total_blocks",
                    "prefix_cache_hit_rate",
                    "device",
                    "gpus",
                    "spec_method",
                    "spec_acceptance_rate",
                )
            )
        )
        out["spec_draft_tokens"] = out["spec_accepted_tokens"] = None
        out["prefix_cache_queries"] = out["prefix_cache_hits"] = None
        return out
    queries, hits = engine.prefix_cache_queries, engine.prefix_cache_hits
    out.update(
        num_requests_running=engine.num_running,
        num_requests_waiting=engine.num_waiting,
        kv_cache_usage=round(engine.kv_usage, 4),
        kv_cache_free_blocks=engine.num_free_blocks,
        kv_cache_total_blocks=engine.num_total_blocks,
        prefix_cache_queries=queries,
        prefix_cache_hits=hits,
        prefix_cache_hit_rate=round(hits / queries, 4) if queries > 0 else None,
        device=engine.device or None,  # "cpu", or its GPU's name
        gpus=engine.gpus,  # its GPU ids (common/gpus.py), [] on a CPU
    )
    spec = engine.spec or {}
    drafted, accepted = spec.get("draft_tokens"), spec.get("accepted_tokens", 0)
    out.update(
        spec_method=engine.spec_method or None,
        spec_draft_tokens=drafted,
        spec_accepted_tokens=accepted,
        spec_acceptance_rate=round(accepted / drafted, 4) if drafted else None,
    )
    return out


def totals(replicas: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in SUMMED:
        values = [r[key] for r in replicas if r.get(key) is not None]
        out[key] = round(sum(values), 2) if values else None
    queries = sum(r["prefix_cache_queries"] or 0 for r in replicas)
    hits = sum(r["prefix_cache_hits"] or 0 for r in replicas)
    out["prefix_cache_hit_rate"] = round(hits / queries, 4) if queries > 0 else None
    drafted = sum(r["spec_draft_tokens"] or 0 for r in replicas)
    accepted = sum(r["spec_accepted_tokens"] or 0 for r in replicas)
    out["spec_acceptance_rate"] = round(accepted / drafted, 4) if drafted > 0 else None
    free, total = out["kv_cache_free_blocks"], out["kv_cache_total_blocks"]
    out["kv_cache_usage"] = round(1 - free / total, 4) if total else None
    out["num_replicas"] = len(replicas)
    out["num_replicas_alive"] = sum(1 for r in replicas if r["alive"])
    return out


def ui_router(config: Config, client: EngineClient, metrics: Metrics) -> APIRouter:
    router = APIRouter()

    @router.get("/stats")
    async def stats() -> JSONResponse:
        ids = sorted(client.cluster.engines()) or [0]
        replicas = [replica_stats(config, client, metrics, k) for k in ids]
        return JSONResponse({"time": time.time(), "replicas": replicas, "totals": totals(replicas)})

    if config.server.ui:
        page = PAGE.read_bytes()  # read once: a missing file fails at start, not per request

        @router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
        async def index() -> HTMLResponse:
            return HTMLResponse(page, headers=PAGE_HEADERS)

    return router
