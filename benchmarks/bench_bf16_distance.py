"""How far bfloat16 moves prompt logprobs from float32: transformers' bf16, and zeroserve's
with the residual stream in the model's dtype and in float32 (issue 38's bf16 target: ours
within transformers' own bf16-to-float32 distance + 0.05, prompt by prompt).

    .venv/bin/python benchmarks/gpu/make_models.py benchmarks/gpu/smollm2-tok /tmp/bfx m135 m1b
    .venv/bin/python benchmarks/bench_bf16_distance.py --models /tmp/bfx/m135 /tmp/bfx/m1b

The oracle is transformers in float32 on the bf16 weights (exactly widened), as the GPU
check's hf_ref.py; the prompts are its three (two fixed texts, 180 tokens of the book).
zeroserve runs in process (`LLMEngine`, dtype bfloat16, `prompt_logprobs`, eager steps)
twice, its op set's residual dtype set to bf16 and then to float32 (the CPU's default is
the model's dtype; the CUDA backend's is float32). On the CPU the op set is the torch
reference (`kernels="torch"`), which rounds where transformers does, so the bf16 row equals
transformers' bf16 there and the float32 row isolates the residual; `--device cuda` runs
the Triton op set. Prints, per prompt, the largest and the mean |logprob - oracle| over the
prompt's tokens. Not a timing.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import copy

import torch

from benchmarks.gpu.hf_ref import prompt_ids
from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine

BOOK = Path(__file__).resolve().parent / "data" / "pride_and_prejudice_ch1-6.txt"


def hf_logprobs(model_dir: Path, prompts: list[list[int]], device: str) -> dict:
    """transformers' prompt-token logprobs in bf16, then in float32 (the oracle)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    model = model.to(device).eval()
    out: dict[str, list[list[float]]] = {"bf16": [], "fp32": []}
    with torch.inference_mode():
        for kind in ("bf16", "fp32"):
            if kind == "fp32":
                model = model.float()  # the bf16 weights, exactly, in float32
            for p in prompts:
                ids = torch.tensor([p], device=device)
                lp = model(input_ids=ids).logits[0].float().log_softmax(-1)
                out[kind].append(lp[torch.arange(len(p) - 1), torch.tensor(p[1:])].tolist())
    return out


def ours(model_dir: Path, prompts: list[list[int]], device: str, wide: bool) -> list[list[float]]:
    """zeroserve's bf16 prompt logprobs, its residual stream float32 (wide) or bf16."""
    kernels = "torch" if device == "cpu" else "auto"
    # eager: a captured graph would keep the op set it was captured with
    model = ModelConfig(
        model=str(model_dir), device=device, dtype="bfloat16", kernels=kernels, enforce_eager=True
    )
    engine = LLMEngine(
        EngineConfig(
            model=model,
            cache=CacheConfig(block_size=16, num_blocks=256, enable_prefix_caching=False),
            scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=2048),
        ),
        model_dir,
    )
    ops = copy.copy(engine.runner.backend.ops)  # the same op set, its residual set here
    ops.residual_dtype = torch.float32 if wide else None
    engine.runner.use_ops(ops)
    got: list[list[float]] = []
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"p{i}", p, params)
        while engine.has_unfinished():
            for out in engine.step():
                if out.prompt_logprobs is not None:
                    got.append([entry[1] for entry in out.prompt_logprobs[1:]])
    return got


def distance(a: list[float], oracle: list[float]) -> tuple[float, float]:
    d = [abs(x - y) for x, y in zip(a, oracle, strict=True)]
    return max(d), sum(d) / len(d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", required=True, help="bf16 model directories")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    from transformers import AutoTokenizer

    for model in map(Path, args.models):
        prompts, _ = prompt_ids(AutoTokenizer.from_pretrained(model), BOOK)
        ref = hf_logprobs(model, prompts, args.device)
        rows = {
            "transformers bf16": ref["bf16"],
            "zeroserve bf16, bf16 residual": ours(model, prompts, args.device, wide=False),
            "zeroserve bf16, float32 residual": ours(model, prompts, args.device, wide=True),
        }
        print(f"\n{model.name} on {args.device}: |logprob - float32 oracle| per prompt, max / mean")
        for name, lps in rows.items():
            cells = [distance(a, o) for a, o in zip(lps, ref["fp32"], strict=True)]
            text = "  ".join(f"{mx:.4f} / {mean:.4f}" for mx, mean in cells)
            excess = max(
                mx - distance(h, o)[0] for (mx, _), h, o in zip(cells, ref["bf16"], ref["fp32"])
            )
            print(f"  {name:34s} {text}   worst excess over transformers {excess:+.4f}")


if __name__ == "__main__":
    main()
