"""A draft model through the real processes: `launch.py --speculative-model smollm2` (the
embedded Q4_1 file drafting for the same model's float32 weights) answers the OpenAI SDK
with the same greedy text whether the request drafts or not, streamed or whole; most
drafts are accepted (usage.timings), and /metrics names the method `draft`."""

from __future__ import annotations

import openai
import pytest

from tests.e2e.conftest import served
from tests.e2e.test_spec_serving import ask_greedy

pytestmark = pytest.mark.timeout(300)

MESSAGES = [{"role": "user", "content": "Write two sentences about the sea."}]


@pytest.fixture(scope="module")
def draft_server(default_model_dir):
    yield from served(
        "--quantization",
        "none",  # the served weights float32, the draft the file's Q4_1 blocks
        "--speculative-model",
        "smollm2",
        "--num-speculative-tokens",
        "4",
        "--speculative-policy",
        "always",  # the counts asserted are the drafter's: the adaptive fit may drop drafts
        workers=1,
    )


def test_draft_model_serves_the_same_text(draft_server):
    client = openai.OpenAI(
        base_url=draft_server.url + "/v1", api_key="x", max_retries=0, timeout=120
    )

    def ask(spec: bool, stream: bool = False) -> tuple[str, dict]:
        return ask_greedy(client, MESSAGES, 40, spec, stream)

    plain, plain_timings = ask(False)
    drafted, timings = ask(True)
    assert drafted == plain and len(plain) > 40
    assert "num_draft_tokens" not in plain_timings
    assert timings["num_accepted_tokens"] > timings["num_draft_tokens"] // 2 > 5, timings
    assert ask(True, stream=True)[0] == plain
    m = draft_server.wait_idle()
    steps = {k: v for k, v in m.items() if k.startswith("zeroserve:spec_decode_num_steps")}
    assert any('method="draft"' in k and 'kind="verify"' in k and v > 0 for k, v in steps.items())
