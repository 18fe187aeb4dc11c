"""Shared fixtures: tiny random models (saved like real HF checkpoints) and the default model.

Tiny models are built from transformers configs with random weights and saved to a temp
dir; the tiny Llama uses the default model's tokenizer (same vocab size) so it can serve
text end to end.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from common.cpu import cpu_kind

# The GPU backend's Triton kernels run on the CPU in Triton's interpreter where torch has
# no CUDA: Triton reads this when their modules are imported, so before any test does
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The embedded SmolLM2-135M-Instruct, converted from GGUF once into the user cache."""
    from common.model_files.model_source import resolve_model

    return resolve_model("smollm2")


def copy_tokenizer_files(src: Path, out: Path) -> None:
    """The tokenizer files of `src` (those it has of TOKENIZER_FILES) into `out`: a tiny
    checkpoint with the default model's vocabulary gets its tokenizer."""
    for name in TOKENIZER_FILES:
        if (Path(src) / name).exists():
            shutil.copy(Path(src) / name, Path(out) / name)


# the shape of every tiny random checkpoint the tests build (tiny_config)
TINY_SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    initializer_range=0.1,
)


def tiny_config(name: str, **overrides):
    """transformers' config class `name` (e.g. "MistralConfig") of the tests' tiny shape
    (TINY_SHAPE), with the family's own fields and any size a test needs in `overrides`."""
    import transformers

    return getattr(transformers, name)(**{**TINY_SHAPE, **overrides})


def save_tiny_llama(out: Path, **overrides) -> Path:
    """A random LlamaForCausalLM (torch seed 0) of the tiny shape with `overrides`, saved
    to `out`: the GPU backend tests' models (real head shapes, as their kernels need)."""
    import transformers

    config = tiny_config("LlamaConfig", **overrides)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(out)
    return out


def _tiny_configs():
    from transformers import GPT2Config

    return {
        # vocab of the default model, so its tokenizer can be copied in
        "llama": (
            "LlamaForCausalLM",
            tiny_config(
                "LlamaConfig",
                vocab_size=49152,
                tie_word_embeddings=True,
                bos_token_id=1,
                eos_token_id=2,
            ),
        ),
        "llama3": (
            "LlamaForCausalLM",
            tiny_config(
                "LlamaConfig",
                vocab_size=512,
                tie_word_embeddings=False,
                eos_token_id=2,
                rope_scaling={
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
            ),
        ),
        "mistral": (
            "MistralForCausalLM",
            tiny_config("MistralConfig", vocab_size=512, eos_token_id=2, sliding_window=None),
        ),
        "qwen2": (
            "Qwen2ForCausalLM",
            tiny_config("Qwen2Config", vocab_size=512, tie_word_embeddings=True, eos_token_id=2),
        ),
        "gpt2": (
            "GPT2LMHeadModel",
            GPT2Config(
                vocab_size=512,
                n_embd=64,
                n_layer=2,
                n_head=4,
                n_positions=512,
                initializer_range=0.1,
                eos_token_id=2,
                bos_token_id=1,
            ),
        ),
    }


TINY_KINDS = ("llama", "llama3", "mistral", "qwen2", "gpt2")


def make_tiny_model(kind: str, out: Path) -> Path:
    import transformers

    arch, config = _tiny_configs()[kind]
    torch.manual_seed(1234)
    model = getattr(transformers, arch)(config).eval()
    if kind == "qwen2":
        randomize_qkv_bias(model)
    model.save_pretrained(out)
    return out


def randomize_qkv_bias(model) -> None:
    """Random, non-zero q/k/v biases (transformers starts them at 0), so that a Qwen2
    checkpoint exercises the bias path."""
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.1)


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory, default_model_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_models")
    dirs = {}
    for kind in TINY_KINDS:
        d = make_tiny_model(kind, root / kind)
        if kind == "llama":
            copy_tokenizer_files(default_model_dir, d)
        dirs[kind] = d
    return dirs


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_model_dirs) -> Path:
    return tiny_model_dirs["llama"]


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """transformers' own greedy generate, one prompt at a time, float32, no EOS stop."""
    import transformers

    from common.model_files.model_source import hf_reference_dir

    model = transformers.AutoModelForCausalLM.from_pretrained(
        hf_reference_dir(model_dir), dtype=torch.float32
    ).eval()
    return hf_greedy_of(model, prompts, max_new_tokens)


def hf_greedy_of(model, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """A loaded transformers model's greedy generate, one prompt at a time, no EOS stop."""
    model.generation_config.eos_token_id = None  # run the full length, like ignore_eos
    outs = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            gen = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=0,
            )
            outs.append(gen[0, len(p) :].tolist())
    return outs


@pytest.fixture
def run_dir() -> Iterator[Path]:
    """A private (0700) run dir for ipc sockets, short-named: ipc paths max ~107 bytes."""
    d = Path(tempfile.mkdtemp(dir="/tmp", prefix="zsg-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


# The CPU kinds a kind-dependent test runs as (in its name): this CPU's, and AVX2-only
# (ZEROSERVE_CPU_KIND) where this CPU is newer, so an AVX-512 machine checks what an AVX2
# one gets (issue 56: a test that held only on AVX-512 failed the suite on AVX2).
CPU_KINDS = (f"on-{cpu_kind()}", "on-avx2-emulated")


@pytest.fixture(params=CPU_KINDS)
def each_cpu_kind(request, monkeypatch) -> Iterator[str]:
    """Runs the test as this CPU and as an emulated AVX2-only one; yields the kind."""
    from common import cpu

    if request.param == "on-avx2-emulated":
        if cpu.cpu_kind() == "avx2" or "avx2" not in cpu.cpu_flags():
            pytest.skip(f"this CPU's kind is {cpu.cpu_kind_label()}: nothing newer to hide")
        monkeypatch.setenv("ZEROSERVE_CPU_KIND", "avx2")
    cpu.cpu_flags.cache_clear()
    yield cpu.cpu_kind()
    monkeypatch.undo()
    cpu.cpu_flags.cache_clear()


def kernels_built() -> bool:
    """Whether the C++ kernels load here. Tests of them skip when not, except under CI
    (CI=true), where a missing build fails the collection instead of skipping silently."""
    from scheduler_worker import kernels

    if kernels.load():
        return True
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(
            "the C++ kernels did not build or load (CI=true: their tests fail, not skip)",
            pytrace=False,
        )
    return False


def fused_and_module_decode(runner, model):
    """One decode step of three sequences (5, 9 and 1 tokens cached) run twice from the
    same KV cache: by the model's one-call C++ plan, then by its modules. Returns (plan's
    logits, modules' logits, [(K, V)] after the plan's step; runner.kv_caches holds the
    modules')."""
    from scheduler_worker.model_runner import SeqInput

    plan = model.decode_plan
    lens = [5, 9, 1]
    tables = [list(range(1 + 4 * i, 5 + 4 * i)) for i in range(len(lens))]
    for i, n in enumerate(lens):
        runner.execute([SeqInput(list(range(10 + i, 10 + i + n)), 0, tables[i])])
    caches = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
    seqs = [SeqInput([7 + i], n, tables[i]) for i, n in enumerate(lens)]
    meta = runner.prepare(seqs)[2]
    runner.step_rows.set_step(meta.num_decode)
    assert plan is not None and plan.takes(meta, len(seqs))
    fused = runner.execute(seqs)
    fused_caches = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
    runner.kv_caches[:] = caches
    model.decode_plan = None
    return fused, runner.execute(seqs), fused_caches
