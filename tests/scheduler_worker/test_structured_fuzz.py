"""Validity fuzz (issue 22's target): 240 random JSON schemas, the default model at
temperature 1, many requests per batch; every output that ends with "stop" validates
against its schema (jsonschema, the oracle)."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from tokenizers import Tokenizer

from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine
from tests.scheduler_worker.schema_gen import top_level

NUM_SCHEMAS = 240
MAX_TOKENS = 48


@pytest.mark.timeout(600)
def test_every_stopped_output_validates(default_model_dir):
    rng = random.Random(2026)
    schemas = [top_level(rng) for _ in range(NUM_SCHEMAS)]
    for s in schemas:
        jsonschema.Draft202012Validator.check_schema(s)
    engine = LLMEngine(
        EngineConfig(
            model=ModelConfig(model="smollm2"),
            cache=CacheConfig(num_blocks=2048),
            scheduler=SchedulerConfig(max_num_seqs=128, max_num_batched_tokens=2048),
        ),
        default_model_dir,
    )
    tok = Tokenizer.from_file(str(default_model_dir / "tokenizer.json"))
    prompt = tok.encode(
        "<|im_start|>user\nReply with JSON only.<|im_end|>\n<|im_start|>assistant\n"
    ).ids
    params = [
        SamplingParams(
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=i,
            structured={"kind": "json", "spec": json.dumps(s)},
        )
        for i, s in enumerate(schemas)
    ]
    outs = engine.generate([prompt] * len(schemas), params)
    finished = {}  # generate() keeps no finish reasons: a stop is an output shorter than
    for i, out in enumerate(outs):  # max_tokens, or one the grammar closed at max_tokens
        text = tok.decode([t for t in out if t != 2], skip_special_tokens=False)
        if len(out) < MAX_TOKENS or out[-1] == 2:
            finished[i] = text
    failures = []
    for i, text in finished.items():
        try:
            jsonschema.validate(json.loads(text), schemas[i])
        except (ValueError, jsonschema.ValidationError) as e:
            failures.append((schemas[i], text, str(e)[:200]))
    assert not failures, failures[:3]
    assert len(finished) >= NUM_SCHEMAS // 3, f"only {len(finished)} outputs finished"
