"""A structured request sent the moment launch.py says ready is served, and the replica
stays alive, both on a first start (llguidance's tokenizer built from tokenizer.json, its
token table then cached) and on the next (built from that table, common.llg_vocab)."""

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


def test_structured_request_first_after_ready(default_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("ZEROSERVE_CACHE_DIR", str(tmp_path))  # no token table yet
    for start in ("from tokenizer.json", "from the cached table"):
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
            assert r.status_code == 200, (start, r.text)
            choice = r.json()["choices"][0]
            assert choice["finish_reason"] == "stop", (start, choice)
            jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)
            health = httpx.get(server.url + "/health", timeout=10).json()
            replicas = health["components"]["scheduler"]["replicas"]
            assert all(r["alive"] for r in replicas.values()) and replicas, (start, health)
        finally:
            code = server.stop()
        assert code == 0, server.log()[-4000:]
        assert "unreadable" not in server.log() and "not cached" not in server.log()
        assert len(list((tmp_path / "llg-vocab").iterdir())) == 1, start
