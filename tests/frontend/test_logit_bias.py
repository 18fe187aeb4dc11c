"""logit_bias at the frontend: passed on to the tokenizer workers as OpenAI's map (string
keys), a bad one a 400 naming it. (Ids past the vocabulary are the tokenizer worker's
400: tests/tokenizer_worker/test_tokenization.py, tests/e2e/test_serving_sampling.py.)"""

from __future__ import annotations

import pytest

from tests.frontend.conftest import requests_for

pytestmark = pytest.mark.timeout(30)

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
COMPLETION = {"prompt": "Hi", "max_tokens": 2}


@pytest.mark.parametrize(
    "path, body", [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)]
)
def test_logit_bias_reaches_the_tokenizer(served, http, path, body):
    bias = {"5": -100, "1234": 50.5, "0": 100}
    r = http.post(path, json={**body, "logit_bias": bias, "n": 2, "temperature": 0.5})
    assert r.status_code == 200, r.text
    reqs = requests_for(served, r.json()["id"])
    ids = {int(t): b for t, b in bias.items()}  # token ids, as the struct holds them
    assert len(reqs) == 2 and all(req.params.logit_bias == ids for req in reqs)
    r = http.post(path, json={**body, "logit_bias": {}})  # asks for nothing
    assert r.status_code == 200, r.text
    (req,) = requests_for(served, r.json()["id"])
    assert req.params.logit_bias is None


@pytest.mark.parametrize(
    "bias, words",
    [
        ({str(i): 1 for i in range(301)}, "at most 300"),
        ({"5": 100.5}, "[-100, 100]"),
        ({"5": -1000}, "[-100, 100]"),
        ({"-1": 5}, "token ids"),
        ({"hello": 5}, "token ids"),
        ({"5": "high"}, "logit_bias"),  # not a number: the schema's 400
        ({"5": True}, "logit_bias"),
        ([5, 1], "logit_bias"),
    ],
)
@pytest.mark.parametrize(
    "path, body", [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)]
)
def test_bad_logit_bias_is_a_400_naming_it(http, path, body, bias, words):
    r = http.post(path, json={**body, "logit_bias": bias})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"].startswith("logit_bias") and words in err["message"], err
