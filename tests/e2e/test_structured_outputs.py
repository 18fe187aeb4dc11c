"""Structured outputs through the real server, with the official `openai` client."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

pytestmark = pytest.mark.timeout(300)


class Person(BaseModel):
    name: str
    age: int
    city: str


SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "year": {"type": "integer", "minimum": 1000, "maximum": 2100},
        "genres": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
    },
    "required": ["title", "year", "genres"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _chat(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def _ended(call, content: str, response_format, max_tokens: int):
    """The one choice of a temperature-0 chat completion (`call`: the SDK's create or
    parse) under `response_format`, which must have ended on its own, not at max_tokens."""
    r = call(
        model="smollm2",
        messages=_chat(content),
        response_format=response_format,
        max_tokens=max_tokens,
        temperature=0,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    return choice


def test_parse_with_a_pydantic_model(client):
    prompt = "Describe a person (name, age, city) as JSON."
    choice = _ended(client.chat.completions.parse, prompt, Person, 120)
    assert isinstance(choice.message.parsed, Person)


def test_json_schema_n_and_seed(client):
    rf = {"type": "json_schema", "json_schema": {"name": "movie", "schema": SCHEMA, "strict": True}}
    kwargs = dict(
        model="smollm2",
        messages=_chat("A movie as JSON."),
        response_format=rf,
        max_tokens=120,
        temperature=1.0,
        seed=5,
        n=3,
    )
    # the prompt in the prefix cache first, so that both runs compute its last token the
    # same way: a full prefill and a cache hit give logits that differ in the last bits,
    # and a seed repeats a sample only from the same logits (a near-tie flips otherwise)
    client.chat.completions.create(**{**kwargs, "n": 1, "max_tokens": 1})
    a = client.chat.completions.create(**kwargs)
    b = client.chat.completions.create(**kwargs)
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    stopped = [c for c in a.choices if c.finish_reason == "stop"]
    assert stopped
    for c in stopped:
        jsonschema.validate(json.loads(c.message.content), SCHEMA)


# no additionalProperties: closed all the same (the declared properties only), as xgrammar,
# outlines and llama.cpp read it. Open, at temperature 0 the model wrote "capital",
# "official_language", "official_language_translation_table", ... until max_tokens.
CITY = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "country": {"type": "string"},
        "population": {"type": "integer"},
    },
    "required": ["name", "country", "population"],
}


def test_a_schema_without_additional_properties_ends(client):
    rf = {"type": "json_schema", "json_schema": {"name": "City", "schema": CITY}}
    c = _ended(client.chat.completions.create, "Give me a city.", rf, 200)
    city = json.loads(c.message.content)
    assert set(city) == {"name", "country", "population"}
    jsonschema.validate(city, CITY)


def test_json_object(client):
    prompt = 'Reply with a JSON object: the key "colour", your favourite colour as its value.'
    c = _ended(client.chat.completions.create, prompt, {"type": "json_object"}, 80)
    assert isinstance(json.loads(c.message.content), dict)


def test_regex_and_choice_via_structured_outputs(client):
    r = client.chat.completions.create(
        model="smollm2",
        messages=_chat("Give me a phone number."),
        max_tokens=20,
        temperature=1.0,
        extra_body={"structured_outputs": {"regex": "[0-9]{3}-[0-9]{4}"}},
    )
    assert re.fullmatch("[0-9]{3}-[0-9]{4}", r.choices[0].message.content)
    assert r.choices[0].finish_reason == "stop"
    r = client.completions.create(
        model="smollm2",
        prompt="Is the sky blue? Answer:",
        max_tokens=5,
        temperature=1.0,
        n=4,
        extra_body={"structured_outputs": {"choice": ["yes", "no", "maybe"]}},
    )
    assert all(c.text in ("yes", "no", "maybe") and c.finish_reason == "stop" for c in r.choices)


def test_generate_with_a_grammar(server):
    body = {
        "prompt": "A list of numbers:",
        "max_new_tokens": 30,
        "temperature": 1.0,
        "stream": False,
        "structured_outputs": {"grammar": 'start: "[" NUM ("," NUM)* "]"\nNUM: /[0-9]{1,2}/\n'},
    }
    r = httpx.post(server.url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    if out["finish_reason"] == "stop":  # the whole grammar
        assert re.fullmatch(r"\[[0-9]{1,2}(,[0-9]{1,2})*\]", out["text"]), out
    else:  # a prefix of it
        assert re.fullmatch(r"\[([0-9]{1,2},)*[0-9]{0,2}", out["text"]), out


def test_streamed_json(client):
    rf = {"type": "json_schema", "json_schema": {"name": "movie", "schema": SCHEMA}}
    stream = client.chat.completions.create(
        model="smollm2",
        messages=_chat("A movie as JSON."),
        response_format=rf,
        max_tokens=120,
        temperature=0,
        stream=True,
    )
    parts, reasons = [], []
    for chunk in stream:
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            reasons.append(c.finish_reason)
    assert reasons[-1] == "stop" and len(parts) > 3
    jsonschema.validate(json.loads("".join(parts)), SCHEMA)


def test_a_grammar_that_breaks_mid_way_is_an_error_not_a_stop(client, server):
    """2,001 choices with one prefix compile, then pass llguidance's limit of 2,000 Earley
    items once the prefix is written: the client gets a 400 naming it (a stream: an error
    event after what it sent), never finish_reason "stop" on text that is no choice; the
    server serves the next request."""
    extra = {"structured_outputs": {"choice": [f"item-{i:05d}" for i in range(2001)]}}
    ask = dict(model="smollm2", messages=_chat("Pick one."), max_tokens=8, temperature=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**ask, extra_body=extra)
    assert "the grammar could not go on" in e.value.message and "2000" in e.value.message
    with pytest.raises(openai.APIError) as e2:
        for _ in client.chat.completions.create(**ask, extra_body=extra, stream=True):
            pass
    assert "the grammar could not go on" in str(e2.value)
    r = client.chat.completions.create(
        **ask, extra_body={"structured_outputs": {"choice": ["yes", "no"]}}
    )
    assert r.choices[0].message.content in ("yes", "no")
    assert r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    "extra, param",
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "objectx"}},
                }
            },
            "response_format",
        ),
        ({"structured_outputs": {"regex": "[a-"}}, "structured_outputs.regex"),
        ({"structured_outputs": {"grammar": "start: nope"}}, "structured_outputs.grammar"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"structured_outputs": {"json": "{bad"}}, "structured_outputs.json"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        (
            {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
            "structured_outputs",
        ),
    ],
)
def test_bad_specs_are_400s_naming_the_field(client, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="smollm2", messages=_chat("Hi"), max_tokens=5, extra_body=extra
        )
    assert e.value.body["param"] == param, e.value.body  # type: ignore[index]


def test_logprobs_and_stop_strings_with_a_grammar(client):
    """Logprobs come with every constrained token (the model's, before the mask); a stop
    string cuts the constrained text as it cuts any other."""
    r = client.chat.completions.create(
        model="smollm2",
        messages=_chat("A phone number, please."),
        max_tokens=20,
        temperature=1.0,
        seed=1,
        logprobs=True,
        top_logprobs=3,
        extra_body={"structured_outputs": {"regex": "[0-9]{3}-[0-9]{4}"}},
    )
    c = r.choices[0]
    assert re.fullmatch("[0-9]{3}-[0-9]{4}", c.message.content)
    lps = c.logprobs.content
    assert "".join(t.token for t in lps) == c.message.content
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 3 for t in lps)
    r = client.chat.completions.create(
        model="smollm2",
        messages=_chat("A phone number, please."),
        max_tokens=20,
        temperature=1.0,
        stop=["-"],
        extra_body={"structured_outputs": {"regex": "[0-9]{3}-[0-9]{4}"}},
    )
    assert re.fullmatch("[0-9]{3}", r.choices[0].message.content)
    assert r.choices[0].finish_reason == "stop"
