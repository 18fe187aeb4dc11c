"""A draft model (--speculative-model, spec/draft_model.py) drafting for the default model:
greedy and seeded output with its drafts equal output without, whether the draft is good
(the default model's own Q4_1 file drafting for its float32 weights: most drafts
accepted) or bad (a random model with the same tokenizer: most refused); a draft model
with another tokenizer is refused at start, in one line, by the engine and by launch.py;
method and model agree in the config."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from common.config import CacheConfig, ConfigError, EngineConfig, ModelConfig, SchedulerConfig
from common.model_files.model_source import check_draft_model
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine
from scheduler_worker.spec.draft_model import DraftModelDrafter
from scheduler_worker.spec.ngram import NgramDrafter

REPO = Path(__file__).resolve().parents[2]
PROMPTS = [
    "<|im_start|>user\nName three colours of the rainbow.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWhat is the capital of France? Answer in a sentence.<|im_end|>\n"
    "<|im_start|>assistant\n",
]


def _engine(model_dir: Path, draft: str, method: str = "none", **sched) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=ModelConfig(model="smollm2", dtype="float32", quantization="none"),
            cache=CacheConfig(num_blocks=128),
            scheduler=SchedulerConfig(
                max_num_seqs=4,
                speculative_method=method,
                speculative_model=draft,
                num_speculative_tokens=4,
                speculative_policy="always",  # every draft verified: the counts are the drafter's
                **sched,
            ),
        ),
        model_dir,
    )


def _prompts(model_dir: Path) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return [tok.encode(p).ids for p in PROMPTS]


def _both(engine: LLMEngine, prompts, **kw) -> tuple[list, list, int, int]:
    """(outputs without drafts, with, drafted tokens, accepted tokens)."""
    plain = engine.generate(prompts, SamplingParams(speculative=False, **kw))
    d0, a0 = engine.counters.draft_tokens, engine.counters.accepted_tokens
    drafted = engine.generate(prompts, SamplingParams(**kw))
    return (
        plain,
        drafted,
        engine.counters.draft_tokens - d0,
        engine.counters.accepted_tokens - a0,
    )


@pytest.fixture(scope="module")
def self_drafted(default_model_dir) -> LLMEngine:
    return _engine(default_model_dir, "smollm2")  # the alias: the embedded Q4_1 file


def test_quantized_self_draft_is_exact_and_mostly_accepted(self_drafted, default_model_dir):
    engine = self_drafted
    drafter = engine.scheduler.drafter
    assert isinstance(drafter, DraftModelDrafter)
    prompts = _prompts(default_model_dir)
    plain, drafted, n_draft, n_acc = _both(engine, prompts, max_tokens=32, temperature=0.0)
    assert drafted == plain
    assert sum(map(len, plain)) > 24
    assert n_draft > 20 and n_acc > n_draft // 2, (n_draft, n_acc)
    # the draft engine's prefix cache: after the first proposal a row computes its newest
    # tokens only, not its whole context again
    assert drafter.num_computed < sum(map(len, prompts)) + 2 * 64 + drafter.num_proposals * 21
    engine.block_manager.check_integrity()
    drafter.engine.block_manager.check_integrity()
    assert not drafter.engine.has_unfinished()


def test_seeded_sampled_rows_equal_with_draft_model(self_drafted, default_model_dir):
    prompts = _prompts(default_model_dir)
    kw = dict(max_tokens=24, temperature=0.8, top_p=0.9, seed=7)
    plain, drafted, n_draft, n_acc = _both(self_drafted, prompts, **kw)
    assert drafted == plain and n_draft > 0 and n_acc > 0


def test_the_draft_model_drafts_beside_the_overlap(default_model_dir):
    """Overlapped scheduling (a GPU's, on the CPU): each step resolves the one in flight
    first and drafts (spec/overlap.py), the draft model's rows kept in step with the
    target's; as many drafts and accepted as synchronously, the outputs the same."""
    engine = _engine(default_model_dir, "smollm2", async_scheduling="on")
    assert engine.overlap
    prompts = _prompts(default_model_dir)
    plain, drafted, n_draft, n_acc = _both(engine, prompts, max_tokens=32, temperature=0.0)
    assert drafted == plain
    assert n_draft > 20 and n_acc > n_draft // 2 and engine.gate.tries > 0, (n_draft, n_acc)
    engine.block_manager.check_integrity()
    engine.scheduler.drafter.engine.block_manager.check_integrity()


@pytest.fixture(scope="module")
def random_drafted(default_model_dir, tiny_llama_dir) -> LLMEngine:
    # ngram first, then a random model with the same tokenizer
    return _engine(default_model_dir, str(tiny_llama_dir), method="ngram")


def test_random_draft_model_is_refused_mostly_yet_exact(random_drafted, default_model_dir):
    drafter = random_drafted.scheduler.drafter
    assert isinstance(drafter, DraftModelDrafter) and isinstance(drafter.first, NgramDrafter)
    prompts = _prompts(default_model_dir)
    proposals = drafter.num_proposals
    plain, drafted, n_draft, n_acc = _both(random_drafted, prompts, max_tokens=8, temperature=0.0)
    assert drafted == plain
    assert drafter.num_proposals > proposals  # the chat prompts: no ngram match at first
    assert n_draft >= 8 and n_acc < n_draft // 2, (n_draft, n_acc)


def test_draft_model_only_where_the_cheaper_drafter_has_none(random_drafted, default_model_dir):
    from tokenizers import Tokenizer

    drafter = random_drafted.scheduler.drafter
    tok = Tokenizer.from_file(str(default_model_dir / "tokenizer.json"))
    prompt = tok.encode("one two three four five six seven. " * 4 + "one two").ids
    proposals = drafter.num_proposals
    plain, drafted, n_draft, n_acc = _both(random_drafted, [prompt], max_tokens=12, temperature=0.0)
    assert drafted == plain and n_acc >= 4, (plain, n_draft, n_acc)  # the repeats: ngram's
    # asked only at the steps ngram had nothing for: fewer than the tokens it generated
    assert drafter.num_proposals - proposals < len(plain[0]) // 2


def _other_tokenizer(tiny_llama_dir: Path, out: Path) -> Path:
    """The tiny model with two tokens' ids swapped in its tokenizer.json."""
    shutil.copytree(tiny_llama_dir, out)
    tok = json.loads((out / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = "hello", "world"
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (out / "tokenizer.json").write_text(json.dumps(tok))
    return out


def test_other_tokenizer_refused(default_model_dir, tiny_llama_dir, tmp_path):
    other = _other_tokenizer(tiny_llama_dir, tmp_path / "other")
    with pytest.raises(ConfigError, match="vocabularies differ; the draft model must share"):
        _engine(default_model_dir, str(other))
    cfg = EngineConfig(scheduler=SchedulerConfig(speculative_model=str(other)))
    with pytest.raises(ConfigError, match=f"--speculative-model {other}"):
        check_draft_model(cfg, default_model_dir)
    check_draft_model(EngineConfig(scheduler=SchedulerConfig()), default_model_dir)  # none


def test_launch_refuses_another_tokenizer_in_one_line(tiny_llama_dir, tmp_path):
    other = str(_other_tokenizer(tiny_llama_dir, tmp_path / "other"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    r = subprocess.run(
        [sys.executable, str(REPO / "launch.py"), "--speculative-model", other, "--port", port],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("launch.py:")]  # (logs aside)
    assert len(lines) == 1 and "tokenizer" in lines[0] and other in lines[0], r.stderr


def test_method_and_model_agree_in_the_config():
    assert SchedulerConfig(speculative_model="m.gguf").speculative_method == "draft"
    assert SchedulerConfig(
        speculative_model="m", speculative_method="ngram"
    ).speculative_method == ("ngram")
    with pytest.raises(ConfigError, match="needs a speculative_model"):
        SchedulerConfig(speculative_method="draft")
