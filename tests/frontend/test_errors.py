"""Errors as OpenAI JSON for bad input: malformed or mistyped bodies and fields (400, naming
the field the client sent), unknown models (404) and routes, OpenAI features not
implemented, a body declared as not JSON (415). Limits and the API key:
test_error_limits.py; errors while a request runs: test_error_runtime.py."""

from __future__ import annotations

import pytest

from tests.frontend.conftest import openai_error

pytestmark = pytest.mark.timeout(30)


def test_malformed_json_is_400(http):
    r = http.post(
        "/v1/completions", content=b'{"prompt": "Hi",', headers={"content-type": "application/json"}
    )
    err = openai_error(r, 400)
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
    err = openai_error(http.post("/v1/completions", json=body), 400)
    assert err["param"] == param and param in err["message"]


def test_chat_schema_errors(http):
    err = openai_error(http.post("/v1/chat/completions", json={"messages": []}), 400)
    assert err["param"] == "messages"
    err = openai_error(
        http.post("/v1/chat/completions", json={"messages": [{"content": "x"}]}), 400
    )
    assert err["param"] == "messages.0.role"
    img = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    err = openai_error(http.post("/v1/chat/completions", json={"messages": [img]}), 400)
    assert err["param"] == "messages.0.content"
    err = openai_error(
        http.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
        ),
        400,
    )
    assert err["param"] == "top_logprobs"


def test_body_not_an_object_is_400(http):
    err = openai_error(http.post("/v1/completions", json=[1, 2]), 400)
    assert err["type"] == "invalid_request_error"


def test_unknown_model_is_404(http):
    err = openai_error(http.post("/v1/completions", json={"model": "gpt-9", "prompt": "Hi"}), 404)
    assert err["code"] == "model_not_found" and err["param"] == "model"


def test_unknown_route_is_openai_json(http):
    err = openai_error(http.get("/v1/nothing"), 404)
    assert err["type"] == "invalid_request_error" and err["code"] == "not_found"
    assert openai_error(http.get("/v1/completions"), 405)["code"] == "method_not_allowed"


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
    err = openai_error(http.post(path, json=body), 400)
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
    err = openai_error(http.post(path, json=body), 400)
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
    err = openai_error(http.post("/v1/completions", json={"prompt": "Hi", field: value}), 400)
    assert err["param"] == field


def test_chat_roles_are_checked(http):
    err = openai_error(
        http.post("/v1/chat/completions", json={"messages": [{"role": "bogus", "content": "Hi"}]}),
        400,
    )
    assert err["param"] == "messages.0.role"


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
        err = openai_error(r, 415)
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
    err = openai_error(http.post(path, json=body), 400)
    assert err["param"] == param and param in err["message"]
