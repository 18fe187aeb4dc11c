"""A structured request sent the moment launch.py says ready is served, and the replica
stays alive: the scheduler builds llguidance's tokenizer (seconds holding the GIL for a
large vocabulary) before it says ready, never during the first constrained request, where
it would silence the heartbeat thread and the frontend would fail the request."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.e2e.conftest import start_server

pytestmark = pytest.mark.timeout(600)

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_structured_request_first_after_ready(default_model_dir):
    server = start_server("--model", str(default_model_dir), workers=1)
    try:
        r = httpx.post(  # the first request, right after "zeroserve ready"
            server.url + "/v1/chat/completions",
            json={
                "model": str(default_model_dir),
                "messages": [{"role": "user", "content": "A person as JSON."}],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "person", "schema": SCHEMA, "strict": True},
                },
                "max_tokens": 60,
                "temperature": 0,
            },
            timeout=120,
        )
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)
        health = httpx.get(server.url + "/health", timeout=10).json()
        replicas = health["components"]["scheduler"]["replicas"]
        assert replicas and all(r["alive"] for r in replicas.values()), health
    finally:
        code = server.stop()
    assert code == 0, server.log()[-4000:]
