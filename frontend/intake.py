"""A request's intake, shared by every API dialect: when it arrived, its body read (JSON
only, at most max_body_bytes), parsed into the dialect's pydantic model, and its `model`
checked against the served names. Bad input is an error before anything else runs:

    415  the body declared as something other than JSON
    413  larger than max_body_bytes (as soon as that is known)
    400  not JSON, a field of the wrong type, a field the model does not have (named)
    404  a model this server does not serve
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import ClientDisconnect

from common.config import Config
from frontend.cluster.engine_client import EngineClient
from frontend.errors import APIError, invalid

# the request bodies' schema: strict, as OpenAI's (`"max_tokens": "3"` and unknown fields
# are 400s)
STRICT = ConfigDict(extra="forbid", strict=True)

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Arrival:
    """When a request arrived, taken before its body is read."""

    monotonic: float
    wall: float

    @classmethod
    def now(cls) -> Arrival:
        return cls(time.monotonic(), time.time())


class Intake:
    def __init__(self, config: Config, client: EngineClient) -> None:
        self.client = client
        self.max_body_bytes = config.server.max_body_bytes
        self.aliases = {config.model_name, config.engine.model.model}

    async def read(self, request: Request, model: type[M]) -> tuple[M, Arrival]:
        """The body as `model`, its model name checked, and when the request arrived."""
        arrival = Arrival.now()
        body = parse(model, await read_body(request, self.max_body_bytes))
        self.check_model(getattr(body, "model", None))
        return body, arrival

    def check_model(self, model: str | None) -> None:
        """404 unless `model` is None or a name of the served model."""
        if model is None or model in self.aliases:
            return
        engine = self.client.cluster.engine
        if engine is not None and model == engine.model:
            return
        raise APIError(
            404,
            f"The model `{model}` does not exist.",
            "invalid_request_error",
            "model",
            "model_not_found",
        )


def check_content_type(request: Request) -> None:
    """415 unless the body is declared JSON (or not declared at all). A browser may POST
    text/plain or a form to any origin without a CORS preflight; parsing such a body as
    JSON would let any web page a local user visits drive this server."""
    declared = request.headers.get("content-type")
    if declared is None:
        return
    media = declared.split(";", 1)[0].strip().lower()
    if media != "application/json" and not (
        media.startswith("application/") and media.endswith("+json")
    ):
        raise APIError(
            415,
            f"Content-Type must be application/json, got {declared[:100]!r}",
            code="unsupported_media_type",
        )


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, or 413 as soon as it is known to exceed max_bytes; 415 when it is
    declared as something other than JSON."""
    check_content_type(request)
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > max_bytes):
        if not length.isdigit():
            raise APIError(400, "invalid Content-Length header")
        raise APIError(
            413, f"request body larger than {max_bytes} bytes", param=None, code="request_too_large"
        )
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise APIError(
                    413, f"request body larger than {max_bytes} bytes", code="request_too_large"
                )
            chunks.append(chunk)
    except ClientDisconnect:  # gone mid-body: nobody reads the answer, nothing to log
        raise APIError(400, "the client disconnected before its body was complete") from None
    return b"".join(chunks)


def parse(model: type[M], body: bytes) -> M:
    """Validate a JSON body; a 400 naming the first offending field on failure."""
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        err = errors[0]
        if err["type"] == "json_invalid":
            raise invalid(f"Invalid JSON body: {err['msg']}") from None
        extra = [x for x in errors if x["type"] == "extra_forbidden"]
        if extra:  # OpenAI's own words for a field the API does not have
            param = _param(extra[0]["loc"])
            raise invalid(f"Unrecognized request argument supplied: {param}", param) from None
        param = _param(err["loc"])
        raise invalid(f"{param or 'body'}: {err['msg']}", param) from None


def _param(loc: tuple) -> str | None:
    # unions report the branch tried (e.g. prompt.list[int].0); keep the field path only
    path = [str(p) for p in loc]
    path = [p for p in path if not (p[:1].isalpha() and ("[" in p or p in _TYPE_NAMES))]
    return ".".join(path) or None


_TYPE_NAMES = {"str", "int", "float", "bool"}
