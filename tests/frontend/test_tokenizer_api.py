"""/tokenize, /detokenize and /tokenizer_info through the real app: bodies checked here,
answered by the (fake) tokenizer pool, errors and the API key as on the other routes."""

from __future__ import annotations

import pytest

from tests.frontend.conftest import serve

pytestmark = pytest.mark.timeout(30)


def test_tokenize_prompt_and_messages(served, http):
    r = http.post("/tokenize", json={"prompt": "Hi!"})
    assert r.status_code == 200, r.text
    assert r.json() == {"count": 3, "max_model_len": 2048, "tokens": [72, 105, 33]}
    call = served.backend.calls[-1]
    assert call.op == "tokenize" and call.args == {
        "prompt": "Hi!",
        "add_special_tokens": True,
        "return_token_strs": False,
    }
    messages = [{"role": "user", "content": [{"type": "text", "text": "Yo"}]}]
    r = http.post("/tokenize", json={"messages": messages, "add_generation_prompt": False})
    assert r.json()["tokens"] == [89, 111]
    assert served.backend.calls[-1].args == {
        "messages": [{"role": "user", "content": "Yo"}],
        "add_generation_prompt": False,
        "add_special_tokens": False,  # the template holds them (vLLM's default for chat)
        "return_token_strs": False,
    }


def test_detokenize_and_tokenizer_info(served, http):
    r = http.post("/detokenize", json={"tokens": [72, 105]})
    assert r.status_code == 200 and r.json() == {"prompt": "Hi"}
    info = http.get("/tokenizer_info").json()
    assert info["tokenizer_class"] == "FakeTokenizer"


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/tokenize", {}, "prompt"),  # neither prompt nor messages
        ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "prompt"),
        ("/tokenize", {"prompt": 3}, "prompt"),
        ("/tokenize", {"prompt": "a", "add_generation_prompt": True}, "add_generation_prompt"),
        ("/tokenize", {"prompt": "a", "bogus": 1}, "bogus"),
        ("/detokenize", {"tokens": "12"}, "tokens"),
        ("/detokenize", {"tokens": [1.5]}, "tokens.0"),
        ("/detokenize", {"tokens": [-1]}, "tokens"),
        ("/detokenize", {"tokens": [1, 2**70]}, "tokens"),  # beyond any wire integer
        ("/detokenize", {"tokens": [0x110000]}, "tokens"),  # the (fake) worker's 400
    ],
)
def test_bad_input_is_400(http, path, body, param):
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_unknown_model_is_404(http):
    assert http.post("/tokenize", json={"prompt": "a", "model": "nope"}).status_code == 404


def test_tokenizer_routes_need_the_api_key():
    with serve(api_key="sekret") as s, s.client() as c:
        assert c.post("/tokenize", json={"prompt": "a"}).status_code == 401
        assert c.post("/detokenize", json={"tokens": [97]}).status_code == 401
        assert c.get("/tokenizer_info").status_code == 401
        good = {"Authorization": "Bearer sekret"}
        assert c.post("/tokenize", json={"prompt": "a"}, headers=good).json()["tokens"] == [97]
