"""FP8 recipes on the default model, in process: perplexity (bench_perplexity's windows) and
next-token logprob distance from bf16 (test_fp8_default_model's prompts) for each recipe,
with the model loaded once (transformers' Llama on the GGUF's full-weights twin, float32).

    .venv/bin/python benchmarks/bench_fp8_recipes.py --chunks 6 [--recipes a,b] [--sweep]

A recipe fake-quantizes each linear: its weight rounded through E4M3 with the recipe's
scales, its input rounded through E4M3 per token (or per token group), the product in
float32, which is quant/fp8.py's emulated scaled matmul up to the order of float32 sums.
--sweep also quantizes one linear type / one layer at a time (where the error comes from).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from fnmatch import fnmatch
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.perplexity.windows import plan_windows

REPO = Path(__file__).resolve().parents[1]
BOOK = REPO / "benchmarks" / "data" / "pride_and_prejudice_ch1-6.txt"
FP8, FP8_MAX = torch.float8_e4m3fn, 448.0
Quant = Callable[[torch.Tensor], torch.Tensor]


def e4m3(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x rounded through E4M3 at `scale` (broadcast), back in float32."""
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).float() * scale


def amax_scale(x: torch.Tensor) -> torch.Tensor:
    return x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / FP8_MAX


def rows(x: torch.Tensor) -> torch.Tensor:
    """Per row (weights: per output channel; activations: per token)."""
    return e4m3(x, amax_scale(x))


def groups(g: int) -> Quant:
    """Per row and group of g columns (activations: per token group, DeepSeek's 1x128)."""

    def q(x: torch.Tensor) -> torch.Tensor:
        r, k = x.shape
        pad = (-k) % g
        xp = F.pad(x, (0, pad)).view(r, -1, g)
        return e4m3(xp, amax_scale(xp)).view(r, -1)[:, :k]

    return q


def blocks(bn: int, bk: int) -> Quant:
    """Weights in bn x bk blocks, one scale each (Qwen3-FP8 / DeepSeek-V3's 128x128)."""

    def q(w: torch.Tensor) -> torch.Tensor:
        n, k = w.shape
        wp = F.pad(w, (0, (-k) % bk, 0, (-n) % bn))
        b = wp.view(wp.shape[0] // bn, bn, -1, bk).transpose(1, 2)
        s = b.abs().amax(dim=(-1, -2), keepdim=True).clamp(min=1e-12) / FP8_MAX
        out = e4m3(b, s).transpose(1, 2).reshape(wp.shape)
        return out[:n, :k]

    return q


def mse_rows(steps: int = 64) -> Quant:
    """Per output channel, the scale among amax/448 * a (a in [0.5, 1]) of least squared
    error of the row (llm-compressor's MSE observer's idea, on E4M3)."""

    def q(w: torch.Tensor) -> torch.Tensor:
        base = amax_scale(w)
        best = rows(w)
        err = (best - w).pow(2).sum(-1, keepdim=True)
        for i in range(1, steps):
            a = 1.0 - 0.5 * i / steps
            cand = e4m3(w, base * a)
            e = (cand - w).pow(2).sum(-1, keepdim=True)
            better = e < err
            best = torch.where(better, cand, best)
            err = torch.minimum(e, err)
        return best

    return q


def jittered(seed: int) -> Quant:
    """Per output channel at amax/448 * 2^u, u uniform in [0, 1) a row: the same error
    statistics as `rows` (E4M3's relative step repeats every power of 2), another draw of
    the rounding; what a recipe's figure varies by for the draw alone."""

    def q(w: torch.Tensor) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        u = torch.rand(w.shape[0], 1, generator=g)
        return e4m3(w, amax_scale(w) * 2**u)

    return q


def bf16(x: torch.Tensor) -> torch.Tensor:
    return x.bfloat16().float()


WEIGHTS: dict[str, Quant] = {
    "bf16": bf16,
    "channel": rows,
    "block128": blocks(128, 128),
    "g128": groups(128),
    "g32": groups(32),
    "mse": mse_rows(),
    **{f"draw{i}": jittered(i) for i in range(1, 5)},
}
ACTS: dict[str, Quant | None] = {
    "exact": None,
    "token": rows,
    "tg128": groups(128),
    "tg64": groups(64),
    "tg32": groups(32),
}


class FakeQuantLinear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, act: Quant | None):
        super().__init__()
        self.weight, self.bias, self.act = weight, bias, act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.act is not None:
            x = self.act(x.reshape(-1, x.shape[-1])).reshape(x.shape)
        return F.linear(x, self.weight, self.bias)


class Harness:
    def __init__(self, chunks: int, ctx: int = 512) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from common.model_files.model_source import hf_reference_dir, resolve_model

        model_dir = resolve_model("smollm2")
        self.model = AutoModelForCausalLM.from_pretrained(
            hf_reference_dir(model_dir), dtype=torch.float32
        ).eval()
        self.model.config.tie_word_embeddings = False  # the head is one more linear here
        head = self.model.lm_head
        self.model.lm_head = nn.Linear(head.in_features, head.out_features, bias=False)
        self.model.lm_head.weight = nn.Parameter(head.weight.detach().clone(), False)
        self.names = [n for n, m in self.model.named_modules() if isinstance(m, nn.Linear)]
        self.orig = {n: self.model.get_submodule(n) for n in self.names}
        tok = AutoTokenizer.from_pretrained(model_dir)
        text = BOOK.read_text(encoding="utf-8")
        ids, plain = tok(text)["input_ids"], tok(text, add_special_tokens=False)["input_ids"]
        bos = None if ids == plain else ids[0]
        self.windows = [w.token_ids for w in plan_windows(ids, ctx, chunks, bos)]
        self.ctx = ctx
        book = text
        prompts = [
            "The capital of France is Paris. The capital of Italy is",
            "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
            book[20000:20500],
        ]
        self.prompts = [tok(t)["input_ids"] for t in prompts]

    def apply(self, recipe: Callable[[str], tuple[Quant | None, Quant | None]]) -> None:
        """recipe(name) -> (weight quant or None: float32, act quant or None: exact)."""
        for n in self.names:
            lin = self.orig[n]
            wq, aq = recipe(n)
            w = lin.weight.detach()
            w = w if wq is None else wq(w)
            parent, _, leaf = n.rpartition(".")
            owner = self.model.get_submodule(parent) if parent else self.model
            setattr(owner, leaf, FakeQuantLinear(w, lin.bias, aq))

    @torch.no_grad()
    def logprobs(self, ids: list[int]) -> torch.Tensor:
        """log p(token j | < j) for j = 1..len-1."""
        x = torch.tensor([ids])
        logits = self.model(x).logits[0, :-1].float()
        return logits.log_softmax(-1).gather(1, x[0, 1:, None])[:, 0]

    def measure(self) -> dict[str, list[torch.Tensor]]:
        first = self.ctx // 2
        win = [self.logprobs(w)[first:] for w in self.windows]
        return {"windows": win, "prompts": [self.logprobs(p) for p in self.prompts]}


def summary(got: dict, ref: dict) -> str:
    nll = -torch.cat(got["windows"])
    ppl = float(nll.mean().exp())
    ref_ppl = float((-torch.cat(ref["windows"])).mean().exp())
    dw = (torch.cat(got["windows"]) - torch.cat(ref["windows"])).abs()
    dp = [(g - r).abs() for g, r in zip(got["prompts"], ref["prompts"], strict=True)]
    prompts = " ".join(f"{float(d.max()):.3f}/{float(d.mean()):.3f}" for d in dp)
    return (
        f"ppl {ppl:.3f} ({(ppl / ref_ppl - 1) * 100:+.2f}%) | prompts max/mean {prompts} | "
        f"windows max {float(dw.max()):.3f} mean {float(dw.mean()):.4f}"
    )


def linear_type(name: str) -> str:
    return name.rpartition(".")[2]


def layer_of(name: str) -> int:
    parts = name.split(".")
    return int(parts[parts.index("layers") + 1]) if "layers" in parts else -1


def keeper(patterns: str) -> Callable[[str], bool]:
    """Linears kept bf16: "|"-separated fnmatch patterns of "<layer>.<type>" ("0.*|*.down_proj")."""
    pats = [x for x in patterns.split("|") if x]
    return lambda n: any(fnmatch(f"{layer_of(n)}.{linear_type(n)}", x) for x in pats)


def recipe(w: str, a: str, keep: Callable[[str], bool] = lambda n: False):
    """Every decoder linear as (w, a); the head and `keep`'s linears bf16."""

    def r(n: str) -> tuple[Quant | None, Quant | None]:
        if n == "lm_head" or keep(n):
            return bf16, None
        return WEIGHTS[w], ACTS[a]

    return r


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--chunks", type=int, default=6)
    p.add_argument("--recipes", default="", help="w:a pairs, comma separated (w, a below)")
    p.add_argument("--sweep", action="store_true", help="one linear type / layer at a time")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    h = Harness(args.chunks)
    h.apply(recipe("bf16", "exact", keep=lambda n: True))
    ref = h.measure()
    h.apply(lambda n: (None, None))
    print("float32 weights:", summary(h.measure(), ref), flush=True)
    for spec in filter(None, args.recipes.split(",")):
        w, a, *keep = spec.split(":")
        t0 = time.perf_counter()
        h.apply(recipe(w, a, keep=keeper(keep[0] if keep else "")))
        print(f"{spec}: {summary(h.measure(), ref)} ({time.perf_counter() - t0:.0f} s)", flush=True)
    if args.sweep:  # W8A8 per channel / token on one linear type, then one span of layers
        types = sorted({linear_type(n) for n in h.names if n != "lm_head"})
        for t in types:
            h.apply(recipe("channel", "token", keep=lambda n, t=t: linear_type(n) != t))
            print(f"only {t} W8A8: {summary(h.measure(), ref)}", flush=True)
        num = h.model.config.num_hidden_layers
        for lo, hi in [(0, 0), (1, 5), (6, 11), (12, 17), (18, 23), (24, 28), (29, 29)]:
            keep = lambda n, lo=lo, hi=hi: not lo <= layer_of(n) <= hi  # noqa: E731
            h.apply(recipe("channel", "token", keep=keep))
            print(
                f"only layers {lo}-{min(hi, num - 1)} W8A8: {summary(h.measure(), ref)}", flush=True
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
