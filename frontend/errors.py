"""OpenAI-style errors: every failure is `{"error": {"message", "type", "param", "code"}}`.

Status codes the frontend itself produces (workers pick their own via RequestError):

    400 invalid_request_error   malformed JSON, a schema mismatch (wrong type, missing
                                field) and out-of-range parameters; `param` names the field.
                                (Never 422: one status for every client-side mistake.)
    401 invalid_request_error   missing / wrong API key (code "invalid_api_key")
    404 invalid_request_error   unknown model (code "model_not_found") or route
    413 invalid_request_error   body over server.max_body_bytes (code "request_too_large")
    415 invalid_request_error   a Content-Type other than JSON (code "unsupported_media_type")
    503 server_error            too many requests in flight (code "overloaded"), components
                                not ready (code "not_ready"), shutting down
    504 server_error            server.request_timeout_s passed (code "timeout")
"""

from __future__ import annotations

import re
from typing import Any

from fastapi.responses import JSONResponse


class APIError(Exception):
    """Raised anywhere in a request's path; rendered by the app's exception handler."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(
    message: str,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | int | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def renamed(err: APIError, aliases: dict[str, str]) -> APIError:
    """`err` with the engine's parameter names (max_tokens, logprobs) replaced by the
    names the client sent (max_completion_tokens, max_new_tokens, top_logprobs)."""
    if not aliases or err.param not in aliases:
        return err
    message = err.message
    for internal, external in aliases.items():
        message = re.sub(rf"\b{internal}\b", external, message)
    return APIError(err.status, message, err.type, aliases[err.param], err.code)


def invalid(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param)


def unavailable(message: str, code: str) -> APIError:
    return APIError(503, message, "server_error", None, code)


def status_code_name(status: int) -> str:
    """OpenAI's `code` is a string: a bare HTTP error (Starlette's 404/405) gets a name."""
    return {404: "not_found", 405: "method_not_allowed"}.get(status, f"http_{status}")


def status_type(status: int) -> str:
    """The OpenAI error type for a bare HTTP status (e.g. Starlette's 404/405)."""
    if status == 401:
        return "invalid_request_error"
    return "server_error" if status >= 500 else "invalid_request_error"
