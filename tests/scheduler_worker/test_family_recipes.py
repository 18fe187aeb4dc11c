"""The families added as a family file over the shared layers' recipe (common/families):
OLMo 2 (post-norm blocks, QK-norm over all heads) and GPT-NeoX / Pythia (parallel
attention and MLP, partial rotary, LayerNorm with bias, its own fused q/k/v layout). Tiny
random checkpoints served by the engine over the paged KV cache equal transformers, token
for token and in logits (float32); the one-call C++ decode step refuses their recipes and
their layers run one by one; tensor parallelism refuses them in one line."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from common.sampling_params import SamplingParams
from scheduler_worker.model_runner import ModelRunner, SeqInput
from scheduler_worker.models.decode_plan import plan_style
from tests.conftest import hf_greedy, kernels_built, tiny_config
from tests.scheduler_worker.test_families import COMMON, PROMPTS, _config


def _olmo2():
    from transformers import Olmo2ForCausalLM

    return Olmo2ForCausalLM(tiny_config("Olmo2Config", **COMMON))


def _gpt_neox(parallel: bool = True):
    from transformers import GPTNeoXForCausalLM

    # Pythia's rotary_pct: RoPE on 4 of each head's 16 dims
    return GPTNeoXForCausalLM(
        tiny_config("GPTNeoXConfig", **COMMON, use_parallel_residual=parallel)
    )


FAMILIES = {
    "olmo2": _olmo2,
    "gpt_neox": _gpt_neox,
    "gpt_neox_serial": lambda: _gpt_neox(parallel=False),  # the pre-norm layout
}


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipes")
    dirs = {}
    for kind, make in FAMILIES.items():
        torch.manual_seed(7)
        model = make().eval()
        with torch.no_grad():  # norms (and their biases) start at 1 and 0: make them random
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.normal_(0.0, 0.3).add_(1.0 if name.endswith("weight") else 0.0)
        model.save_pretrained(root / kind)
        dirs[kind] = root / kind
    return dirs


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_prefill_logits_equal_transformers(kind, family_dirs):
    import transformers

    model_dir = family_dirs[kind]
    ref = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    runner = ModelRunner(_config(model_dir), model_dir)
    prompt = PROMPTS[0]
    with torch.no_grad():
        expected = ref(torch.tensor([prompt])).logits[0, -1]
    got = runner.execute([SeqInput(prompt, 0, list(range(10)))])[0]
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", sorted(FAMILIES))
@pytest.mark.parametrize("kernels", ["auto", "torch"])
def test_engine_greedy_equals_transformers(kind, kernels, family_dirs):
    """Chunked prefill (16-token steps) and batched decode, on the C++ op set and torch."""
    from scheduler_worker.engine import LLMEngine

    model_dir = family_dirs[kind]
    engine = LLMEngine(_config(model_dir, kernels), model_dir)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    assert engine.generate(PROMPTS, params) == hf_greedy(model_dir, PROMPTS, 16)
    engine.block_manager.check_integrity()


@pytest.mark.skipif(not kernels_built(), reason="the C++ kernels are not built here")
@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_the_one_call_decode_step_refuses_the_recipe(kind, family_dirs):
    """int8 weights on the C++ kernels (where a Llama's decode steps take the one call):
    no plan, even were the family to ask for one (decode_style ()), and the decode steps
    run the layers one by one, near the float model's logits."""
    model_dir = family_dirs[kind]
    cfg = _config(model_dir)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, quantization="int8"))
    runner = ModelRunner(cfg, model_dir)
    assert runner.model.decode_plan is None
    assert plan_style(dataclasses.replace(runner.model.args, decode_style=())) is None
    float_runner = ModelRunner(_config(model_dir), model_dir)
    prompt = PROMPTS[1]
    for r in (runner, float_runner):
        r.execute([SeqInput(prompt, 0, list(range(4)))])
    step = [SeqInput([prompt[-1]], len(prompt), list(range(4)))]
    got, want = runner.execute(step)[0], float_runner.execute(step)[0]
    assert torch.isfinite(got).all() and torch.dist(got, want) < 0.1 * want.norm()


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_tensor_parallelism_refuses_them_in_one_line(kind, family_dirs):
    from common.config import ConfigError
    from common.model_facts import read_hf_config
    from scheduler_worker.models import architecture_of, servable_args
    from scheduler_worker.parallel.partition import plan_partition

    hf = read_hf_config(family_dirs[kind])
    args = servable_args(hf, architecture_of(hf))
    with pytest.raises(ConfigError, match="is not sharded yet") as e:
        plan_partition(args, 0, 2)
    assert "\n" not in str(e.value)
