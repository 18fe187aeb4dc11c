"""The hand-written hostile requests (test_hostile_requests.py): each with its exact status
and the parameter / limit its error must name."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.api_checks import CHAT, CONTEXT, VOCAB


# -- hand-written hostile requests ------------------------------------------------------------
def raw(
    path: str, content: bytes, status: int, param: str | None, *words: str, marks=(), id: str
) -> Any:
    return pytest.param(path, content, status, param, words, marks=marks, id=id)


def body(
    path: str, obj: dict[str, Any], status: int, param: str | None, *words: str, marks=(), id: str
) -> Any:
    return raw(path, json.dumps(obj).encode(), status, param, *words, marks=marks, id=id)


C, CH, G = "/v1/completions", "/v1/chat/completions", "/generate"


SMALL = {"max_tokens": 2}


BIG_INT = 2**64  # one past the largest unsigned 64-bit integer


HOSTILE = [
    # encoding and framing
    raw(
        C,
        b'{"prompt": "hi \xff\xfe", "max_tokens": 2}',
        400,
        None,
        "Invalid JSON",
        id="invalid-utf8-in-string",
    ),
    raw(
        CH,
        b'{"messages": [{"role": "user", "content": "\xc3\x28"}], "max_tokens": 2}',
        400,
        None,
        "Invalid JSON",
        id="invalid-utf8-chat",
    ),
    raw(G, b'\xff\xfe{"prompt": "hi"}', 400, None, "Invalid JSON", id="invalid-utf8-before-json"),
    raw(
        C,
        b'{"prompt": "\\ud800", "max_tokens": 2}',
        400,
        None,
        "Invalid JSON",
        id="lone-surrogate-escape",
    ),
    raw(
        C,
        b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        400,
        None,
        "Invalid JSON",
        id="nested-100k-deep",
    ),
    raw(C, b"", 400, None, "Invalid JSON", id="empty-body"),
    raw(C, b"[1, 2]", 400, None, "object", id="json-array-body"),
    # messages of the wrong shape
    body(CH, {"messages": "hello"}, 400, "messages", "array", id="messages-string"),
    body(CH, {"messages": ["hello", "there"]}, 400, "messages.0", id="messages-list-of-strings"),
    body(
        CH,
        {"messages": [{"content": "hello"}]},
        400,
        "messages.0.role",
        "required",
        id="message-without-role",
    ),
    body(
        CH,
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}
                    ],
                }
            ]
        },
        400,
        "messages.0.content",
        "image_url",
        id="content-part-image",
    ),
    body(CH, {"messages": []}, 400, "messages", "empty", id="messages-empty"),
    # output length
    body(C, {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens", ">= 1", id="max_tokens-0"),
    body(C, {"prompt": "hi", "max_tokens": -5}, 400, "max_tokens", ">= 1", id="max_tokens-neg"),
    body(
        C,
        {"prompt": "hi", "max_tokens": CONTEXT},
        400,
        "max_tokens",
        str(CONTEXT),
        id="max_tokens-context",
    ),
    body(
        CH, {"messages": CHAT, "max_tokens": 0}, 400, "max_tokens", ">= 1", id="chat-max_tokens-0"
    ),
    body(
        CH,
        {"messages": CHAT, "max_tokens": -5},
        400,
        "max_tokens",
        ">= 1",
        id="chat-max_tokens-neg",
    ),
    body(
        CH,
        {"messages": CHAT, "max_tokens": CONTEXT},
        400,
        "max_tokens",
        str(CONTEXT),
        id="chat-max_tokens-context",
    ),
    body(
        CH,
        {"messages": CHAT, "max_completion_tokens": 0},
        400,
        "max_completion_tokens",
        ">= 1",
        id="chat-max_completion_tokens-0",
    ),
    body(
        G,
        {"prompt": "hi", "max_new_tokens": 0},
        400,
        "max_new_tokens",
        ">= 1",
        id="generate-max_new_tokens-0",
    ),
    body(
        G,
        {"prompt": "hi", "max_new_tokens": CONTEXT},
        400,
        "max_new_tokens",
        str(CONTEXT),
        id="generate-max_new_tokens-context",
    ),
    # server limits
    body(C, {"prompt": "hi", **SMALL, "n": 9}, 400, "n", "8", id="n-9"),
    body(CH, {"messages": CHAT, **SMALL, "n": 9}, 400, "n", "8", id="chat-n-9"),
    body(C, {"prompt": "hi", **SMALL, "logprobs": 21}, 400, "logprobs", "20", id="logprobs-21"),
    body(
        CH,
        {"messages": CHAT, **SMALL, "logprobs": True, "top_logprobs": 21},
        400,
        "top_logprobs",
        "20",
        id="chat-top_logprobs-21",
    ),
    body(
        C,
        {"prompt": "hi", **SMALL, "stop": [f"s{i}" for i in range(17)]},
        400,
        "stop",
        "16",
        id="stop-17",
    ),
    body(
        CH,
        {"messages": CHAT, **SMALL, "stop": [f"s{i}" for i in range(17)]},
        400,
        "stop",
        "16",
        id="chat-stop-17",
    ),
    # non-finite floats: Python's json writes NaN / Infinity literals; 1e400 overflows
    raw(
        C,
        b'{"prompt": "hi", "max_tokens": 2, "temperature": NaN}',
        400,
        "temperature",
        "finite",
        id="temperature-NaN",
    ),
    raw(
        C,
        b'{"prompt": "hi", "max_tokens": 2, "top_p": NaN}',
        400,
        "top_p",
        "finite",
        id="top_p-NaN",
    ),
    raw(
        CH,
        b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, '
        b'"temperature": Infinity}',
        400,
        "temperature",
        "finite",
        id="chat-temperature-inf",
    ),
    raw(
        C,
        b'{"prompt": "hi", "max_tokens": 2, "temperature": -Infinity}',
        400,
        "temperature",
        "finite",
        id="temperature-minus-inf",
    ),
    raw(
        C,
        b'{"prompt": "hi", "max_tokens": 2, "temperature": 1e400}',
        400,
        "temperature",
        "finite",
        id="temperature-1e400",
    ),
    raw(
        G,
        b'{"prompt": "hi", "max_new_tokens": 2, "top_p": 1e400}',
        400,
        "top_p",
        "finite",
        id="generate-top_p-1e400",
    ),
    # token ids
    body(
        C,
        {"prompt": [1, VOCAB], **SMALL},
        400,
        "prompt",
        "vocabulary",
        str(VOCAB),
        id="prompt-id-vocab",
    ),
    body(C, {"prompt": [[VOCAB]], **SMALL}, 400, "prompt", "vocabulary", id="prompt-batch1-vocab"),
    body(C, {"prompt": [2**31], **SMALL}, 400, "prompt", id="prompt-id-2**31"),
    body(C, {"prompt": [-1], **SMALL}, 400, "prompt", ">= 0", id="prompt-id-negative"),
    # seeds: 64 bits (signed or unsigned)
    body(C, {"prompt": "hi", **SMALL, "seed": 2**64}, 400, "seed", "64-bit", id="seed-2**64"),
    body(
        C,
        {"prompt": "hi", **SMALL, "seed": -(2**63) - 1},
        400,
        "seed",
        "64-bit",
        id="seed-below-int64",
    ),
    body(C, {"prompt": "hi", **SMALL, "seed": 10**30}, 400, "seed", id="seed-10**30"),
    # integers beyond any wire type
    body(C, {"prompt": "hi", "max_tokens": BIG_INT}, 400, "max_tokens", id="max_tokens-2**64"),
    body(
        G,
        {"prompt": "hi", "max_new_tokens": BIG_INT},
        400,
        "max_new_tokens",
        id="generate-max_new_tokens-2**64",
    ),
    body(C, {"prompt": "hi", **SMALL, "top_k": BIG_INT}, 400, "top_k", id="top_k-2**64"),
    body(
        C,
        {"prompt": "hi", **SMALL, "stop_token_ids": [BIG_INT]},
        400,
        "stop_token_ids",
        id="stop_token_ids-2**64",
    ),
    body(
        C,
        {"prompt": "hi", **SMALL, "stop_token_ids": [VOCAB]},
        400,
        "stop_token_ids",
        "vocabulary",
        id="stop_token_ids-vocab",
    ),
]
