"""--load-format dummy: random weights from config.json alone. Every family gets the real
load's parameters (names, shapes, dtypes), finite logits in float32 / bfloat16 / float16,
norms at their identity gain; the engine serves a directory with no weight files, the
same tokens every start; what cannot work is refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from common.config import CacheConfig, ConfigError, EngineConfig, ModelConfig
from common.model_files.model_source import (
    ModelSourceError,
    check_load_format,
    check_weight_source,
    default_gguf_path,
    resolve_model,
)
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine
from scheduler_worker.model_runner import ModelRunner, SeqInput
from tests.conftest import TOKENIZER_FILES
from tests.scheduler_worker.family_models import FAMILIES, save_family


def config_only(src: Path, out: Path) -> Path:
    """`src` without its weights: config.json and the tokenizer files it has."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", *TOKENIZER_FILES):
        if (src / name).is_file():
            shutil.copy(src / name, out / name)
    assert not list(out.glob("*.safetensors"))
    return out


def runner(model_dir: Path, dtype: str, load_format: str = "dummy") -> ModelRunner:
    model = ModelConfig(
        model=str(model_dir), dtype=dtype, device="cpu", load_format=load_format,
        quantization="none", kernels="torch",
    )  # fmt: skip
    return ModelRunner(EngineConfig(model=model, cache=CacheConfig(num_blocks=16)), model_dir)


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """family -> (the tiny checkpoint, its config-only twin)."""
    root = tmp_path_factory.mktemp("dummy_families")
    return {
        f: (save_family(f, root / f), config_only(root / f, root / f"{f}-config")) for f in FAMILIES
    }


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_has_the_real_loads_parameters_and_finite_logits(family_dirs, family):
    real_dir, dummy_dir = family_dirs[family]
    real = runner(real_dir, "float32", "auto")
    shapes = {n: (p.shape, p.dtype) for n, p in real.model.named_parameters()}
    for dtype, torch_dtype in [
        ("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16),
    ]:  # fmt: skip
        r = runner(dummy_dir, dtype)
        got = {n: (p.shape, p.dtype) for n, p in r.model.named_parameters()}
        assert {n: s for n, (s, _) in got.items()} == {n: s for n, (s, _) in shapes.items()}
        assert {d for _, d in got.values()} == {torch_dtype}
        for mod in r.model.modules():
            weight = getattr(mod, "weight", None)
            if isinstance(weight, torch.Tensor) and weight.dim() == 1:  # a norm: gain 1
                gain = weight.float() + getattr(mod, "weight_offset", 0.0)
                assert torch.equal(gain, torch.ones_like(gain)), (family, mod)
        logits = r.execute([SeqInput(list(range(3, 40)), 0, [0, 1, 2])])
        assert logits.shape == (1, r.vocab_size) and torch.isfinite(logits).all(), (family, dtype)
        # spread enough that the argmax is no tie: a unit-variance head, not near-zero
        # weights (Granite divides its logits by 4)
        assert 0.1 < logits.float().std().item() < 5.0, (family, dtype, logits.std())


def test_engine_serves_a_directory_without_weights(tiny_llama_dir, tmp_path):
    d = config_only(tiny_llama_dir, tmp_path / "llama")
    assert (d / "tokenizer.json").is_file()
    assert resolve_model(str(d)) == d.absolute()  # config + tokenizer: enough to resolve
    outs = []
    for _ in range(2):
        model = ModelConfig(model=str(d), dtype="float32", device="cpu", load_format="dummy")
        engine = LLMEngine(EngineConfig(model=model, cache=CacheConfig(num_blocks=64)), d)
        params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
        outs.append(engine.generate([[1, 2, 3, 4, 5], [9, 8, 7]], params))
        assert engine.vocab_size == 49152
    assert [len(t) for t in outs[0]] == [8, 8]
    assert all(0 <= t < 49152 for t in outs[0][0] + outs[0][1])
    assert outs[0] == outs[1]  # seeded: the same weights every start (and every replica)
    assert outs[0][0] != outs[0][1]  # the prompts lead somewhere different: not one tied argmax


def test_refusals(tiny_llama_dir, tmp_path):
    with pytest.raises(ModelSourceError, match="needs a Hugging Face model directory"):
        check_load_format("dummy", "smollm2")
    with pytest.raises(ModelSourceError, match="a GGUF file carries its weights"):
        check_load_format("dummy", str(default_gguf_path()))
    check_load_format("auto", "smollm2")  # only dummy asks for a directory
    with pytest.raises(ConfigError, match="pick one"):
        ModelConfig(load_format="dummy", quantization="gguf")
    with pytest.raises(ConfigError, match="load_format must be one of"):
        ModelConfig(load_format="npz")
    # a directory without config.json: nothing to size a model from
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelSourceError, match="no config.json"):
        resolve_model(str(empty))
    # without weights and without dummy: the engine says which flag serves random ones
    d = config_only(tiny_llama_dir, tmp_path / "noweights")
    with pytest.raises(ModelSourceError, match="no \\*.safetensors.*--load-format dummy"):
        check_weight_source("auto", d)
    check_weight_source("dummy", d)
    # a GGUF model's cached conversion: dummy refused (its weights are in the file)
    with pytest.raises(ModelSourceError, match="not a GGUF file"):
        check_weight_source("dummy", resolve_model("smollm2"))
    assert json.loads((d / "config.json").read_text())["vocab_size"] == 49152
