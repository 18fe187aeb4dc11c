"""Errors as OpenAI JSON: bad input (400), unknown model (404), worker errors passed
through, overload (503), API key (401), oversized bodies (413), timeouts (504)."""

from __future__ import annotations

import threading

import httpx
import pytest

from common.config import ServerConfig
from tests.frontend.conftest import serve
from tests.frontend.sse import parse_sse

pytestmark = pytest.mark.timeout(30)


def _error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def test_malformed_json_is_400(http):
    r = http.post(
        "/v1/completions", content=b'{"prompt": "Hi",', headers={"content-type": "application/json"}
    )
    err = _error(r, 400)
    assert err["type"] == "invalid_request_error" and "JSON" in err["message"]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": "Hi", "temperature": "hot"}, "temperature"),  # wrong type
        ({"prompt": "Hi", "temperature": -1}, "temperature"),  # out of range
        ({"prompt": "Hi", "top_p": 0}, "top_p"),
        ({"prompt": "Hi", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "Hi", "logprobs": 99}, "logprobs"),
        ({"prompt": "Hi", "n": 100}, "n"),
        ({"prompt": "Hi", "stop": ""}, "stop"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [1, -2]}, "prompt"),
        ({}, "prompt"),  # missing
    ],
)
def test_invalid_parameter_is_400_naming_it(http, body, param):
    err = _error(http.post("/v1/completions", json=body), 400)
    assert err["param"] == param and param in err["message"]


def test_chat_schema_errors(http):
    err = _error(http.post("/v1/chat/completions", json={"messages": []}), 400)
    assert err["param"] == "messages"
    err = _error(http.post("/v1/chat/completions", json={"messages": [{"content": "x"}]}), 400)
    assert err["param"] == "messages.0.role"
    img = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    err = _error(http.post("/v1/chat/completions", json={"messages": [img]}), 400)
    assert err["param"] == "messages.0.content"
    err = _error(
        http.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
        ),
        400,
    )
    assert err["param"] == "top_logprobs"


def test_body_not_an_object_is_400(http):
    err = _error(http.post("/v1/completions", json=[1, 2]), 400)
    assert err["type"] == "invalid_request_error"


def test_unknown_model_is_404(http):
    err = _error(http.post("/v1/completions", json={"model": "gpt-9", "prompt": "Hi"}), 404)
    assert err["code"] == "model_not_found" and err["param"] == "model"


def test_unknown_route_is_openai_json(http):
    err = _error(http.get("/v1/nothing"), 404)
    assert err["type"] == "invalid_request_error" and err["code"] == "not_found"
    assert _error(http.get("/v1/completions"), 405)["code"] == "method_not_allowed"


@pytest.mark.parametrize(
    "path, body, param",
    [
        # a field the API does not have: OpenAI's own words, naming it
        ("/v1/completions", {"prompt": "Hi", "some_future_field": 1}, "some_future_field"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi", "x": 1}]},
            "messages.0.x",
        ),
        (
            "/v1/completions",
            {"prompt": "Hi", "stream_options": {"include_usage": True, "y": 2}},
            "stream_options.y",
        ),
    ],
)
def test_unknown_fields_are_refused(http, path, body, param):
    err = _error(http.post(path, json=body), 400)
    assert err["param"] == param
    assert err["message"] == f"Unrecognized request argument supplied: {param}"


CHAT = {"messages": [{"role": "user", "content": "Hi"}]}


@pytest.mark.parametrize(
    "path, extra, param",
    [
        ("/v1/completions", {"suffix": "end"}, "suffix"),
        ("/v1/completions", {"best_of": 3}, "best_of"),
        ("/v1/chat/completions", {"modalities": ["text", "audio"]}, "modalities"),
        (
            "/v1/chat/completions",
            {
                "messages": [
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": None, "function_call": {"name": "f"}},
                ]
            },
            "messages.1.function_call",
        ),
    ],
)
def test_unsupported_openai_features_are_refused_not_ignored(http, path, extra, param):
    body = {**({"prompt": "Hi"} if path == "/v1/completions" else CHAT), **extra}
    err = _error(http.post(path, json=body), 400)
    assert err["param"] == param and "not supported" in err["message"]


@pytest.mark.parametrize(
    "path, extra",
    [
        ("/v1/completions", {"logit_bias": {}, "echo": False, "suffix": None, "best_of": 1}),
        (
            "/v1/chat/completions",
            {
                "response_format": {"type": "text"},
                "tools": [],
                "tool_choice": "none",
                "parallel_tool_calls": True,
                "store": False,
                "metadata": {"k": "v"},
                "service_tier": "auto",
                "modalities": ["text"],
                "user": "u",
            },
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [  # an assistant message as the API returns it
                    {"role": "user", "content": "Hi"},
                    {
                        "role": "assistant",
                        "content": "Hello",
                        "refusal": None,
                        "annotations": [],
                        "audio": None,
                        "function_call": None,
                        "tool_calls": None,
                    },
                    {"role": "user", "content": "Again"},
                ]
            },
        ),
    ],
)
def test_openai_fields_that_change_nothing_are_accepted(http, path, extra):
    body = {**({"prompt": "Hi"} if path == "/v1/completions" else CHAT), **extra}
    assert http.post(path, json=body).status_code == 200


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_tokens", "3"),
        ("max_tokens", True),
        ("max_tokens", 2.5),
        ("stream", "yes"),
        ("ignore_eos", "true"),
        ("temperature", "0.5"),
        ("n", 1.0),
        ("stop", 5),
    ],
)
def test_wrong_json_types_are_400_not_coerced(http, field, value):
    err = _error(http.post("/v1/completions", json={"prompt": "Hi", field: value}), 400)
    assert err["param"] == field


def test_chat_roles_are_checked(http):
    err = _error(
        http.post("/v1/chat/completions", json={"messages": [{"role": "bogus", "content": "Hi"}]}),
        400,
    )
    assert err["param"] == "messages.0.role"


@pytest.mark.parametrize("stream", [False, True])
def test_worker_request_error_passes_through(http, stream):
    # streaming too: the response waits for the first output, so the error keeps its status
    err = _error(http.post("/v1/completions", json={"prompt": "bad", "stream": stream}), 400)
    assert err == {
        "message": "prompt is bad",
        "type": "invalid_request_error",
        "param": "prompt",
        "code": None,
    }


def test_error_after_stream_started_is_an_sse_event(http):
    with http.stream("POST", "/v1/completions", json={"prompt": "fail-late", "stream": True}) as r:
        assert r.status_code == 200
        events = parse_sse(r.read().decode())
    assert events[0]["choices"][0]["text"] == "Hello"
    assert events[-2]["error"]["message"] == "engine exploded"
    assert events[-1] == "[DONE]"


def test_error_after_a_plain_text_stream_started_ends_it(served, http):
    """/generate streams plain text, which cannot carry an error: the text so far, then
    the end of the stream; the request is released (nothing left in flight)."""
    with http.stream("POST", "/generate", json={"prompt": "fail-late"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        assert r.read().decode() == "Hello"
    assert not served.app.state.client.routes


def test_error_after_start_non_streaming_keeps_its_status(http):
    err = _error(http.post("/v1/completions", json={"prompt": "fail-late"}), 500)
    assert err["type"] == "server_error"


def test_too_many_requests_in_flight_is_503():
    with serve(max_queued_requests=1) as s, s.client() as c:
        held: dict = {}
        t = threading.Thread(target=lambda: held.setdefault("r", _post_quietly(s.url, "hold")))
        t.start()
        assert s.backend.wait_for(lambda b: any(r.prompt == "hold" for r in b.requests))
        err = _error(c.post("/v1/completions", json={"prompt": "Hi"}), 503)
        assert err["code"] == "overloaded"
        # n=2 can never fit a limit of 1: a client error naming both, not "retry later"
        err = _error(c.post("/v1/completions", json={"prompt": "Hi", "n": 2}), 400)
        assert err["param"] == "n" and "max_queued_requests" in err["message"]
        assert s.backend.wait_for(lambda b: len(b.aborts) == 1, 5)  # the held client gave up
        t.join(5)
        assert c.post("/v1/completions", json={"prompt": "Hi"}).status_code == 200


def test_several_frontends_each_admit_their_share_of_the_limit():
    """api_servers 2: this frontend takes 2 of max_queued_requests 4 in flight; a request
    within the whole limit but above the share is still taken when nothing else runs."""
    with serve(max_queued_requests=4, api_servers=2) as s, s.client() as c:
        held = [threading.Thread(target=_post_quietly, args=(s.url, "hold")) for _ in range(2)]
        for t in held:
            t.start()
        assert s.backend.wait_for(lambda b: sum(r.prompt == "hold" for r in b.requests) == 2)
        err = _error(c.post("/v1/completions", json={"prompt": "Hi"}), 503)
        assert err["code"] == "overloaded"
        assert s.backend.wait_for(lambda b: len(b.aborts) == 2, 5)  # the held clients gave up
        for t in held:
            t.join(5)
        r = c.post("/v1/completions", json={"prompt": "Hi", "n": 3})
        assert r.status_code == 200 and len(r.json()["choices"]) == 3


def _post_quietly(url: str, prompt: str) -> int | None:
    try:  # the client gives up after 0.5 s: a disconnect the server must turn into an abort
        return httpx.post(url + "/v1/completions", json={"prompt": prompt}, timeout=0.5).status_code
    except httpx.TimeoutException:
        return None


def test_api_key():
    with serve(api_key="sekret") as s, s.client() as c:
        body = {"prompt": "Hi"}
        denied = c.post("/v1/completions", json=body)
        assert _error(denied, 401)["code"] == "invalid_api_key"
        assert denied.headers["www-authenticate"] == "Bearer"
        bad = {"Authorization": "Bearer wrong"}
        assert c.post("/v1/completions", json=body, headers=bad).status_code == 401
        assert c.get("/v1/models").status_code == 401
        assert c.post("/generate", json=body).status_code == 401
        good = {"Authorization": "Bearer sekret"}
        assert c.post("/v1/completions", json=body, headers=good).status_code == 200
        assert c.get("/v1/models", headers=good).status_code == 200
        assert c.get("/health").status_code == 200 and c.get("/metrics").status_code == 200
        assert _error(c.get("/openapi.json"), 401)["code"] == "invalid_api_key"
        assert c.get("/docs").status_code == 404  # no docs page: nothing to leak the schema
        schema = c.get("/openapi.json", headers=good)
        assert schema.status_code == 200 and "/v1/completions" in schema.json()["paths"]
        assert "/openapi.json" not in schema.json()["paths"]


def test_openapi_is_open_without_an_api_key(served, http):
    schema = http.get("/openapi.json")
    assert schema.status_code == 200 and "/v1/chat/completions" in schema.json()["paths"]


def test_body_too_large_is_413():
    with serve(max_body_bytes=1024) as s, s.client() as c:
        err = _error(c.post("/v1/completions", json={"prompt": "x" * 2000}), 413)
        assert err["code"] == "request_too_large"

        def chunked():  # no Content-Length: the limit holds while reading
            yield b'{"prompt": "'
            yield b"x" * 2000
            yield b'"}'

        assert c.post("/v1/completions", content=chunked()).status_code == 413
        assert c.post("/v1/completions", json={"prompt": "x" * 500}).status_code == 200


def test_timeout_aborts_and_is_504():
    with serve(request_timeout_s=0.3) as s, s.client() as c:
        err = _error(c.post("/v1/completions", json={"prompt": "hold"}), 504)
        assert err["code"] == "timeout"
        assert err == _error(
            c.post("/v1/completions", json={"prompt": "hold", "stream": True}), 504
        )
        with c.stream("POST", "/v1/completions", json={"prompt": "slow", "stream": True}) as r:
            assert r.status_code == 200
            events = parse_sse(r.read().decode())
        assert events[-2]["error"]["code"] == "timeout" and events[-1] == "[DONE]"
        assert s.backend.wait_for(lambda b: len(b.aborts) == 3)
        assert set(s.backend.aborted().values()) == {"timeout"}


def test_configured_limits_name_themselves():
    with serve(max_tokens_limit=100, max_n=2, max_body_bytes=2000) as s, s.client() as c:
        err = _error(c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 101}), 400)
        assert err["param"] == "max_tokens" and "100" in err["message"]
        err = _error(c.post("/generate", json={"prompt": "Hi", "max_new_tokens": 500}), 400)
        assert err["param"] == "max_new_tokens"
        err = _error(
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
        err = _error(c.post("/v1/completions", json={"prompt": "Hi", "n": 3}), 400)
        assert err["param"] == "n" and "[1, 2]" in err["message"]
        err = _error(c.post("/v1/completions", json={"prompt": "x" * 3000}), 413)
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
            ("/v1/chat/completions", CHAT),
        ):
            assert c.post(path, json=body).status_code == 200, path
        defaults = sorted(
            (r.kind, r.params.max_tokens, r.params.max_tokens_cap) for r in s.backend.requests
        )
        assert defaults == [("chat", None, 10), ("completion", None, 10), ("completion", None, 10)]


def test_stop_string_limit_is_configurable():
    with serve(max_stop_strings=2) as s, s.client() as c:
        body = {"prompt": "Hi", "stop": ["a", "b", "c"]}
        err = _error(c.post("/v1/completions", json=body), 400)
        assert err["param"] == "stop" and "max_stop_strings" in err["message"]
        body["stop"] = ["a", "b"]
        assert c.post("/v1/completions", json=body).status_code == 200
        err = _error(c.post("/v1/completions", json={"prompt": "Hi", "stop": ["x" * 2000]}), 400)
        assert err["param"] == "stop" and "1024" in err["message"]


@pytest.mark.parametrize(
    "content_type, status",
    [
        (None, 200),  # not declared: parsed as JSON
        ("application/json", 200),
        ("application/json; charset=utf-8", 200),
        ("application/merge-patch+json", 200),
        ("text/plain", 415),  # what a cross-origin page can send without a preflight
        ("application/x-www-form-urlencoded", 415),  # curl -d without -H
        ("multipart/form-data; boundary=x", 415),
    ],
)
def test_a_body_declared_as_not_json_is_415(http, content_type, status):
    headers = {} if content_type is None else {"content-type": content_type}
    r = http.post("/v1/completions", content=b'{"prompt": "Hi", "max_tokens": 2}', headers=headers)
    if status == 200:
        assert r.status_code == 200, r.text
    else:
        err = _error(r, 415)
        assert err["code"] == "unsupported_media_type" and "Content-Type" in err["message"]


@pytest.mark.parametrize(
    "path, body, param",
    [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 0},
            "max_completion_tokens",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": 21},
            "top_logprobs",
        ),
        ("/generate", {"prompt": "Hi", "max_new_tokens": 0}, "max_new_tokens"),
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 2**64}, "max_tokens"),
        ("/v1/completions", {"prompt": "Hi", "stop_token_ids": [2**64]}, "stop_token_ids"),
    ],
)
def test_errors_name_the_field_the_client_sent(http, path, body, param):
    err = _error(http.post(path, json=body), 400)
    assert err["param"] == param and param in err["message"]


def test_api_key_from_the_environment_and_never_empty(monkeypatch):
    from common.config import ConfigError

    with pytest.raises(ConfigError, match="api_key must not be empty"):
        ServerConfig(api_key="  ")
    monkeypatch.setenv("ZEROSERVE_API_KEY", "from-env")  # kept off the command line
    assert ServerConfig().api_key == "from-env"
    assert ServerConfig(api_key="flag").api_key == "flag"


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
