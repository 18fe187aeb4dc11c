"""The server's own limits and its API key: 401 without the key (the environment's key, never
an empty one), 413 past the body size, configured limits that name themselves, and
ServerConfig refusing limits that make no sense."""

from __future__ import annotations

import pytest

from common.config import ServerConfig
from tests.frontend.conftest import openai_error, serve

pytestmark = pytest.mark.timeout(30)


def test_api_key():
    with serve(api_key="sekret") as s, s.client() as c:
        body = {"prompt": "Hi"}
        denied = c.post("/v1/completions", json=body)
        assert openai_error(denied, 401)["code"] == "invalid_api_key"
        assert denied.headers["www-authenticate"] == "Bearer"
        bad = {"Authorization": "Bearer wrong"}
        assert c.post("/v1/completions", json=body, headers=bad).status_code == 401
        assert c.get("/v1/models").status_code == 401
        assert c.post("/generate", json=body).status_code == 401
        good = {"Authorization": "Bearer sekret"}
        assert c.post("/v1/completions", json=body, headers=good).status_code == 200
        assert c.get("/v1/models", headers=good).status_code == 200
        assert c.get("/health").status_code == 200 and c.get("/metrics").status_code == 200
        assert openai_error(c.get("/openapi.json"), 401)["code"] == "invalid_api_key"
        assert c.get("/docs").status_code == 404  # no docs page: nothing to leak the schema
        schema = c.get("/openapi.json", headers=good)
        assert schema.status_code == 200 and "/v1/completions" in schema.json()["paths"]
        assert "/openapi.json" not in schema.json()["paths"]


def test_openapi_is_open_without_an_api_key(served, http):
    schema = http.get("/openapi.json")
    assert schema.status_code == 200 and "/v1/chat/completions" in schema.json()["paths"]


def test_api_key_from_the_environment_and_never_empty(monkeypatch):
    from common.config import ConfigError

    with pytest.raises(ConfigError, match="api_key must not be empty"):
        ServerConfig(api_key="  ")
    monkeypatch.setenv("ZEROSERVE_API_KEY", "from-env")  # kept off the command line
    assert ServerConfig().api_key == "from-env"
    assert ServerConfig(api_key="flag").api_key == "flag"


def test_body_too_large_is_413():
    with serve(max_body_bytes=1024) as s, s.client() as c:
        err = openai_error(c.post("/v1/completions", json={"prompt": "x" * 2000}), 413)
        assert err["code"] == "request_too_large"

        def chunked():  # no Content-Length: the limit holds while reading
            yield b'{"prompt": "'
            yield b"x" * 2000
            yield b'"}'

        assert c.post("/v1/completions", content=chunked()).status_code == 413
        assert c.post("/v1/completions", json={"prompt": "x" * 500}).status_code == 200


def test_configured_limits_name_themselves():
    with serve(max_tokens_limit=100, max_n=2, max_body_bytes=2000) as s, s.client() as c:
        err = openai_error(c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 101}), 400)
        assert err["param"] == "max_tokens" and "100" in err["message"]
        err = openai_error(c.post("/generate", json={"prompt": "Hi", "max_new_tokens": 500}), 400)
        assert err["param"] == "max_new_tokens"
        err = openai_error(
            c.post(
                "/v1/chat/completions",
                json={
                    "messages": [{"role": "user", "content": "Hi"}],
                    "max_completion_tokens": 101,
                },
            ),
            400,
        )
        assert err["param"] == "max_completion_tokens" and "limit" in err["message"]
        err = openai_error(c.post("/v1/completions", json={"prompt": "Hi", "n": 3}), 400)
        assert err["param"] == "n" and "[1, 2]" in err["message"]
        err = openai_error(c.post("/v1/completions", json={"prompt": "x" * 3000}), 413)
        assert "2000" in err["message"]
        ok = c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 100, "n": 2})
        assert ok.status_code == 200


def test_a_limit_below_the_default_caps_the_default():
    """A request that sets no max_tokens gets the endpoint's default capped by the limit,
    never a 400 for a value the client did not send."""
    with serve(max_tokens_limit=10) as s, s.client() as c:
        for path, body in (
            ("/v1/completions", {"prompt": "Hi"}),
            ("/generate", {"prompt": "Hi", "stream": False}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
        ):
            assert c.post(path, json=body).status_code == 200, path
        defaults = sorted(
            (r.kind, r.params.max_tokens, r.params.max_tokens_cap) for r in s.backend.requests
        )
        assert defaults == [("chat", None, 10), ("completion", None, 10), ("completion", None, 10)]


def test_stop_string_limit_is_configurable():
    with serve(max_stop_strings=2) as s, s.client() as c:
        body = {"prompt": "Hi", "stop": ["a", "b", "c"]}
        err = openai_error(c.post("/v1/completions", json=body), 400)
        assert err["param"] == "stop" and "max_stop_strings" in err["message"]
        body["stop"] = ["a", "b"]
        assert c.post("/v1/completions", json=body).status_code == 200
        err = openai_error(
            c.post("/v1/completions", json={"prompt": "Hi", "stop": ["x" * 2000]}), 400
        )
        assert err["param"] == "stop" and "1024" in err["message"]


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_n", 0),
        ("max_body_bytes", 0),
        ("max_tokens_limit", 0),
        ("max_queued_requests", 0),
        ("request_timeout_s", -1.0),
        ("request_timeout_s", float("nan")),
        ("startup_timeout_s", float("inf")),
        ("drain_timeout_s", -1.0),
        ("max_stop_strings", 65),
    ],
)
def test_server_limits_are_validated(field, value):
    from common.config import ConfigError

    with pytest.raises(ConfigError, match=field):
        ServerConfig(**{field: value})
