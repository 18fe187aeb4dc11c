"""Reading an HTTP request's body, shared by every API dialect: JSON only (415 otherwise),
at most `max_bytes` (413 as soon as it is known to be larger)."""

from __future__ import annotations

from fastapi import Request

from frontend.errors import APIError


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
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise APIError(
                413, f"request body larger than {max_bytes} bytes", code="request_too_large"
            )
        chunks.append(chunk)
    return b"".join(chunks)
