"""The HTTP API: an OpenAI-compatible subset, the seed server's /generate, /health, /metrics.

    POST /v1/completions, /v1/chat/completions   OpenAI schema; SSE when `stream`
    POST /generate                               {"prompt", "max_new_tokens", "stream", ...}
    GET  /v1/models, /v1/models/{model}           the one served model
    POST /tokenize, /detokenize; GET /tokenizer_info   vLLM's, by the tokenizer pool
    POST /v1/messages, /v1/messages/count_tokens   Anthropic's (frontend.api.anthropic)
    POST /v1/responses; GET, DELETE /v1/responses/{id}   OpenAI's Responses API
    GET  /v1/responses/{id}/input_items          (frontend.api.openai_responses)
    GET  /health                                 200 when every component is alive, else 503
    GET  /metrics                                Prometheus text (zeroserve:* names)
    GET  /, /stats                               the web page and its live figures (frontend.ui)

Authentication: with `server.api_key` set, /v1/*, /generate and the tokenizer routes need
`Authorization: Bearer <key>` or `x-api-key: <key>` (compared in constant time) and answer
401 otherwise;
/health, /metrics and /stats stay open so probes and scrapers need no secret.
Errors are OpenAI JSON (see frontend.errors); client mistakes are 400, never 422.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from common.config import Config
from common.log import get_logger
from frontend.api.anthropic import add_anthropic_routes
from frontend.api.openai import add_openai_routes
from frontend.api.openai_responses import add_responses_routes
from frontend.chat_path import ChatPath
from frontend.cluster.engine_client import EngineClient
from frontend.cluster.health import health_report
from frontend.cluster.members import StartupStopped
from frontend.engine_path import EnginePath
from frontend.errors import APIError, error_body, status_code_name, status_type
from frontend.frontends import metrics_dir
from frontend.intake import Intake
from frontend.metrics import Metrics
from frontend.room import Room
from frontend.tokenizer_api import add_tokenizer_routes
from frontend.ui import ui_router

log = get_logger("frontend.app")


def _auth_dependency(api_key: str | None):
    expected = api_key.encode() if api_key else None

    async def check_api_key(request: Request) -> None:
        if expected is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        bearer = token.strip().encode() if scheme.lower() == "bearer" else None
        x_api_key = request.headers.get("x-api-key")  # Anthropic's header
        given = [bearer, x_api_key.strip().encode() if x_api_key is not None else None]
        if not any(key is not None and hmac.compare_digest(key, expected) for key in given):
            raise APIError(
                401,
                "Invalid or missing API key (Authorization: Bearer <key>, or x-api-key).",
                "invalid_request_error",
                None,
                "invalid_api_key",
                {"WWW-Authenticate": "Bearer"},
            )

    return check_api_key


def body_schema(model: type[BaseModel]) -> dict:
    """The route's JSON body in /openapi.json: handlers read the raw body themselves (to
    bound its size and answer 400 rather than 422), so FastAPI cannot infer it."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    defs = schema.pop("$defs", {})
    _BODY_DEFS.update(defs)
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


_BODY_DEFS: dict[str, dict] = {}


def create_app(config: Config) -> FastAPI:
    """The FastAPI app. Its lifespan binds the sockets; until every component is alive,
    /health and the generation routes answer 503. With server.listen_when_ready the
    lifespan startup (and so the port opening, which uvicorn does after it) waits for
    every component instead, at most server.startup_timeout_s."""
    shared = metrics_dir(config)  # several frontends: their per-request metrics summed
    metrics = Metrics(None if shared is None else str(shared))
    client = EngineClient(config, metrics)
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client.start()
        try:
            if config.server.listen_when_ready:
                try:
                    await client.cluster.wait_ready(
                        config.server.startup_timeout_s, stopped=lambda: client.draining
                    )
                except StartupStopped:  # a stop signal came first: uvicorn exits after startup
                    log.info("stopped before every component was up")
            yield
        finally:
            client.close()

    app = FastAPI(
        title="zeroserve",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # served below, behind the API key like the routes it describes
    )
    app.state.client = client
    app.state.metrics = metrics

    @app.exception_handler(APIError)
    async def on_api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        body = error_body(
            str(exc.detail), status_type(exc.status_code), None, status_code_name(exc.status_code)
        )
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body(f"invalid request: {exc.errors()}"), status_code=400)

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return JSONResponse(error_body("internal server error", "server_error"), status_code=500)

    api = APIRouter(dependencies=[Depends(_auth_dependency(config.server.api_key))])

    def model_card() -> dict:
        engine = client.cluster.engine
        return {
            "id": config.model_name,
            "object": "model",
            "created": started,
            "owned_by": "zeroserve",
            "root": config.engine.model.model,
            "max_model_len": engine.max_model_len if engine else None,
        }

    # every dialect reads its bodies by one intake and serves chat by one chat path
    chat = ChatPath(config, client, EnginePath(config, client))
    room = Room(api, Intake(config, client), chat, client, body_schema)
    add_openai_routes(room, model_card)
    add_tokenizer_routes(room)
    add_anthropic_routes(room)
    add_responses_routes(room)
    app.include_router(api)

    def openapi() -> dict:  # FastAPI's schema plus the models the bodies refer to
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schema.setdefault("components", {}).setdefault("schemas", {}).update(_BODY_DEFS)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override
    docs = APIRouter(dependencies=[Depends(_auth_dependency(config.server.api_key))])

    @docs.get("/openapi.json", include_in_schema=False)
    async def openapi_json() -> JSONResponse:
        return JSONResponse(openapi())

    app.include_router(docs)

    @app.get("/health")
    async def health() -> JSONResponse:
        now = time.monotonic()
        missing = client.cluster.missing(now)
        components = health_report(client.cluster, now)
        if client.draining:
            return JSONResponse(
                {"status": "draining", "missing": missing, "components": components},
                status_code=503,
            )
        if missing:
            return JSONResponse(
                {"status": "unavailable", "missing": missing, "components": components},
                status_code=503,
            )
        return JSONResponse({"status": "ok", "components": components})

    # load balancers that probe with HEAD (out of the schema: one operation id a route)
    app.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    app.include_router(ui_router(config, client, metrics))

    return app
