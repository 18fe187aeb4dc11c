"""Evaluation-harness requests through the real processes (lm-eval-harness's
local-completions shape): token-id and batched prompts, echo, logprobs, max_tokens 0.
The prompt logprobs equal transformers' log-softmax within 1e-3 (the float_server serves
the dequantized float32 weights that transformers loads)."""

from __future__ import annotations

import httpx
import pytest
import torch

pytestmark = pytest.mark.timeout(300)
TOL = 1e-3
TEXTS = ["The capital of France is Paris.", "Two plus two equals four, said the teacher."]


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(default_model_dir)


@pytest.fixture(scope="module")
def hf_model(default_model_dir):
    import transformers

    from common.model_files.model_source import hf_reference_dir

    model = transformers.AutoModelForCausalLM.from_pretrained(
        hf_reference_dir(default_model_dir), dtype=torch.float32
    )
    return model.eval()


def hf_logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, :-1].float().log_softmax(dim=-1)


def post(server, body: dict) -> dict:
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_loglikelihood_request_matches_transformers(float_server, tokenizer, hf_model):
    """As lm-eval sends it: token-id prompts (context + continuation), echo, logprobs 1,
    max_tokens 0; sent twice (the second time the prefix cache holds the prompts)."""
    prompts = [tokenizer(t)["input_ids"] for t in TEXTS]
    body = {"model": "smollm2", "prompt": prompts, "max_tokens": 0, "echo": True, "logprobs": 1}
    first, again = post(float_server, body), post(float_server, body)
    for out in (first, again):
        assert [c["index"] for c in out["choices"]] == [0, 1]
        assert out["usage"]["prompt_tokens"] == sum(map(len, prompts))
        assert out["usage"]["completion_tokens"] == 0
        for choice, ids in zip(out["choices"], prompts):
            assert choice["text"] == tokenizer.decode(ids)
            lp = choice["logprobs"]
            assert len(lp["tokens"]) == len(ids) and lp["token_logprobs"][0] is None
            assert lp["top_logprobs"][0] is None
            ref = hf_logprobs(hf_model, ids)
            want = [ref[p - 1, ids[p]].item() for p in range(1, len(ids))]
            assert lp["token_logprobs"][1:] == pytest.approx(want, abs=TOL)
            best = [max(top.values()) for top in lp["top_logprobs"][1:]]
            assert best == pytest.approx(ref.max(dim=-1).values.tolist(), abs=TOL)
            assert lp["tokens"] == [tokenizer.decode([t]) for t in ids]
    for a, b in zip(first["choices"], again["choices"]):  # batched differently: not bit-equal
        assert a["logprobs"]["tokens"] == b["logprobs"]["tokens"]
        assert a["logprobs"]["token_logprobs"][1:] == pytest.approx(
            b["logprobs"]["token_logprobs"][1:], abs=TOL
        )


def test_batched_text_prompts_echo_and_generate(float_server, tokenizer, hf_model):
    body = {"prompt": TEXTS, "max_tokens": 3, "echo": True, "logprobs": 2, "n": 2}
    body |= {"temperature": 0, "ignore_eos": True}
    out = post(float_server, body)
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    for choice in out["choices"]:
        text = TEXTS[choice["index"] // 2]
        ids = tokenizer(text)["input_ids"]
        assert choice["text"].startswith(text) and len(choice["text"]) > len(text)
        lp = choice["logprobs"]
        assert len(lp["token_logprobs"]) == len(ids) + 3
        assert all(len(top) == 2 for top in lp["top_logprobs"][1:])
        ref = hf_logprobs(hf_model, ids)
        want = [ref[p - 1, ids[p]].item() for p in range(1, len(ids))]
        assert lp["token_logprobs"][1 : len(ids)] == pytest.approx(want, abs=TOL)
        assert lp["text_offset"][len(ids)] == len(text)  # generated text after the echo
