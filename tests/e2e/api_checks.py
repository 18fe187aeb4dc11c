"""What the API fuzz and hostile-request tests check after every case, and the
default model's limits they probe."""

from __future__ import annotations

import json
from typing import Any

import httpx

MAX_BODY_BYTES = 4 << 20  # ServerConfig.max_body_bytes
CONTEXT = 8192  # the default model's max_model_len
VOCAB = 49152  # the default model's vocabulary
CHAT = [{"role": "user", "content": "hi"}]


def assert_openai_error(status: int, text: str, where: str = "") -> dict[str, Any]:
    """A 4xx body is `{"error": {"message": str, "type": str, ...}}`; returns the error."""
    try:
        body = json.loads(text)
    except ValueError:
        raise AssertionError(f"{where}: {status} body is not JSON: {text[:300]!r}") from None
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), (
        f"{where}: {status} body is not an OpenAI error: {text[:300]!r}"
    )
    err = body["error"]
    assert isinstance(err.get("message"), str) and err["message"], f"{where}: {err}"
    assert isinstance(err.get("type"), str) and err["type"], f"{where}: {err}"
    return err


def assert_serves(server) -> None:
    r = httpx.post(
        server.url + "/v1/completions",
        timeout=60,
        json={"prompt": "A normal request", "max_tokens": 4, "ignore_eos": True},
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 4


def assert_intact(server, pids_before: list[int]) -> None:
    assert httpx.get(server.url + "/health", timeout=5).status_code == 200
    assert_serves(server)
    assert sorted(server.pids()) == pids_before, "a server process died or was restarted"
    server.wait_idle(timeout_s=15)
