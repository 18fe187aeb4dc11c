"""Schema-constrained output ends on its own in every dialect (issue 55), on the real
server with the default model and each dialect's official client (the calls are those of
benchmarks/check_structured_ends.py, which runs five prompts per dialect).

The schema is the one people write: no additionalProperties, a `number` field. Before
numbers were bounded, "Describe Oslo as JSON." wrote `"population_millions":
120000000000…` until max_tokens. Greedy in every dialect, and sampled (temperature 0.7, a
fixed seed) in those that take a seed (the Responses and Messages APIs take none).
"""

from __future__ import annotations

import pytest

from benchmarks.check_structured_ends import DIALECTS, SEEDLESS, Clients

pytestmark = pytest.mark.timeout(300)

PROMPT = "Describe Oslo as JSON."
MAX_TOKENS = 120  # an ended object here is 30-50 tokens


@pytest.fixture(scope="module")
def clients(server) -> Clients:
    return Clients.at(server.url)


CASES = [(name, None) for name in DIALECTS] + [
    (name, 7) for name in DIALECTS if name not in SEEDLESS
]


@pytest.mark.parametrize("dialect, seed", CASES, ids=[f"{d}-seed{s}" for d, s in CASES])
def test_the_object_ends_and_validates(clients, dialect, seed):
    out = DIALECTS[dialect](clients, PROMPT, seed, MAX_TOKENS)
    assert out.ended, (out.reason, out.tokens, out.text)
    assert out.valid(), out.text
    assert out.tokens < MAX_TOKENS
