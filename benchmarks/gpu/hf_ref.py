"""transformers' side of the GPU check, for one model directory, run while no server is up:

* the prompt tokens' logprobs in float32 (the oracle) and in bfloat16 (a yardstick: how
  far bf16 alone moves them), for 3 fixed prompts;
* greedy decoding of 32 tokens (bf16 and float32), argmax of the raw logits at each
  step (no EOS masking, as the server's ignore_eos), with the top1-top2 margins;
* the baseline: model.generate greedy, ~100-token prompts, 128 new tokens, batch 1 and
  32 (left padding), dynamic cache and, when it works, the static cache (no compile).

  python hf_ref.py MODEL_DIR OUT.json [--device cuda] [--text FILE] [--no-baseline]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

FIXED = [
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + "
    "fibonacci(n - 2)\n\nprint([fibonacci(i) for i in range(10)])\n",
]
GREEDY_TOKENS = 32


def save(res: dict, out: str) -> None:
    """Written after each part (atomically), so a timeout keeps what was done."""
    tmp = Path(out + ".tmp")
    tmp.write_text(json.dumps(res))
    tmp.replace(out)


def log(msg: str) -> None:
    print(f"[hf_ref {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def prompt_ids(tok, text_file: Path | None) -> tuple[list[list[int]], list[int]]:
    """The 3 check prompts' ids (two fixed texts, ~180 tokens of the book) and the book's ids."""
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in FIXED]
    book: list[int] = []
    if text_file is not None and text_file.is_file():
        book = tok(text_file.read_text()[:60000], add_special_tokens=False)["input_ids"]
    if len(book) < 200:  # no book: a repeated sentence
        book = tok(" ".join([FIXED[0]] * 300), add_special_tokens=False)["input_ids"]
    prompts.append(book[:180])
    return prompts, book


@torch.inference_mode()
def prompt_logprobs(model, ids: list[int], dev: torch.device) -> tuple[list[float | None], dict]:
    """Each prompt token's logprob (None for the first), and the last position's argmax
    token with its logprob (what a max_tokens=1 greedy request returns)."""
    x = torch.tensor([ids], device=dev)
    logits = model(input_ids=x).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    tgt = torch.tensor(ids[1:], device=dev)
    got = lp[:-1].gather(1, tgt[:, None])[:, 0]
    top = torch.topk(lp[-1], 2)
    last = {
        "id": int(top.indices[0]),
        "lp": float(top.values[0]),
        "margin": float(top.values[0] - top.values[1]),
    }
    return [None, *got.tolist()], last


@torch.inference_mode()
def greedy(model, ids: list[int], n: int, dev: torch.device) -> tuple[list[int], list[float]]:
    """argmax of the raw logits, n steps, with the KV cache; per step the top1-top2 gap."""
    out = model(input_ids=torch.tensor([ids], device=dev), use_cache=True)
    toks: list[int] = []
    margins: list[float] = []
    for _ in range(n):
        last = out.logits[0, -1].float()
        top = torch.topk(last, 2)
        t = int(top.indices[0])
        toks.append(t)
        margins.append(float(top.values[0] - top.values[1]))
        out = model(
            input_ids=torch.tensor([[t]], device=dev),
            past_key_values=out.past_key_values,
            use_cache=True,
        )
    return toks, margins


def timed_generate(model, batch: torch.Tensor, mask: torch.Tensor, new: int, dev, **kw) -> float:
    sync(dev)
    t = time.perf_counter()
    out = model.generate(
        input_ids=batch,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=new,
        min_new_tokens=new,
        **kw,
    )
    sync(dev)
    dt = time.perf_counter() - t
    assert out.shape[1] == batch.shape[1] + new, (out.shape, batch.shape, new)
    return dt


def baseline(
    model, tok, book: list[int], dev: torch.device, new: int, whole: dict, out: str
) -> dict:
    """Decode tok/s of model.generate: (B * (new - 1)) / (t(new) - t(1)). Saved into
    whole["baseline"] (and `out`) after each variant."""
    res: dict = {"prompt_tokens": 100, "new_tokens": new}
    whole["baseline"] = res
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    gen_kw = {"pad_token_id": pad}
    variants = [("dynamic", {})]
    variants.append(("static", {"cache_implementation": "static", "disable_compile": True}))
    for b in (1, 32):
        rows = [book[(i * 37) % max(1, len(book) - 100) :][:100] for i in range(b)]
        rows = [r + [pad] * (100 - len(r)) for r in rows]  # (all 100 long: no padding)
        batch = torch.tensor(rows, device=dev)
        mask = torch.ones_like(batch)
        for name, kw in variants:
            key = f"b{b}_{name}"
            try:
                timed_generate(model, batch, mask, 4, dev, **gen_kw, **kw)  # warm-up
                t1 = min(timed_generate(model, batch, mask, 1, dev, **gen_kw, **kw) for _ in "ab")
                tn = timed_generate(model, batch, mask, new, dev, **gen_kw, **kw)
                ok = tn > t1 and new > 1
                res[key] = {
                    "batch": b,
                    "seconds_total": round(tn, 3),
                    "seconds_first_token": round(t1, 4),
                    "decode_tok_s": round(b * (new - 1) / (tn - t1), 1) if ok else None,
                    "e2e_tok_s": round(b * new / tn, 1),
                    "ms_per_step": round(1000 * (tn - t1) / (new - 1), 2) if ok else None,
                }
                log(f"baseline {key}: {res[key]}")
                save(whole, out)
            except Exception as e:  # noqa: BLE001 - record and go on
                res[key] = {"error": f"{type(e).__name__}: {e}"[:400]}
                log(f"baseline {key} failed: {e!r}")
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--text", type=Path, default=None)
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--greedy-tokens", type=int, default=GREEDY_TOKENS)
    ap.add_argument("--new-tokens", type=int, default=128, help="baseline: tokens generated")
    args = ap.parse_args()
    dev = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 is float32 (the oracle)
    torch.backends.cudnn.allow_tf32 = False
    res: dict = {
        "model": args.model,
        "device": str(dev),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(args.model)
    prompts, book = prompt_ids(tok, args.text)
    res["prompts"] = [{"ids": p, "n": len(p)} for p in prompts]
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).to(dev).eval()
    res["load_s"] = round(time.perf_counter() - t0, 2)
    res["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    log(
        f"loaded {args.model} bf16 on {dev} in {res['load_s']}s; prompts {[len(p) for p in prompts]}"
    )

    for i, p in enumerate(prompts):
        lp, last = prompt_logprobs(model, p, dev)
        res["prompts"][i]["lp_bf16"], res["prompts"][i]["last_bf16"] = lp, last
    g_bf16, m_bf16 = greedy(model, prompts[0], args.greedy_tokens, dev)
    res["greedy"] = {
        "prompt_index": 0,
        "bf16_ids": g_bf16,
        "bf16_strs": [tok.decode([t], skip_special_tokens=False) for t in g_bf16],
        "bf16_margins": [round(m, 4) for m in m_bf16],
        "bf16_text": tok.decode(g_bf16, skip_special_tokens=True),
    }
    log(f"greedy bf16: {g_bf16[:12]}... min margin {min(m_bf16):.4f}")
    save(res, args.out)

    # the oracle, before the baseline: a slow baseline must not cost the reference
    model = model.float()  # the bf16 weights, exactly, in float32
    for i, p in enumerate(prompts):
        lp32, last = prompt_logprobs(model, p, dev)
        res["prompts"][i]["lp_fp32"], res["prompts"][i]["last_fp32"] = lp32, last
        last["str"] = tok.decode([last["id"]], skip_special_tokens=False)
        lp16 = res["prompts"][i]["lp_bf16"]
        d = [abs(a - b) for a, b in zip(lp32[1:], lp16[1:])]
        res["prompts"][i]["hf_bf16_vs_fp32_max_abs"] = max(d) if d else None
    g32, m32 = greedy(model, prompts[0], args.greedy_tokens, dev)
    res["greedy"]["fp32_ids"] = g32
    res["greedy"]["fp32_strs"] = [tok.decode([t], skip_special_tokens=False) for t in g32]
    res["greedy"]["fp32_margins"] = [round(m, 4) for m in m32]
    agree = next((k for k, (a, b) in enumerate(zip(g_bf16, g32)) if a != b), len(g32))
    res["greedy"]["hf_bf16_vs_fp32_agree"] = agree
    res["finite"] = all(v is None or math.isfinite(v) for p in res["prompts"] for v in p["lp_fp32"])
    res["seconds_reference"] = round(time.perf_counter() - t0, 1)
    save(res, args.out)
    log(
        f"reference done in {res['seconds_reference']}s; hf bf16 vs fp32 max |dlp| per prompt "
        f"{[round(p['hf_bf16_vs_fp32_max_abs'] or 0, 4) for p in res['prompts']]}, "
        f"greedy bf16/fp32 agree {agree}/{len(g32)}"
    )

    if not args.no_baseline:
        model = model.to(torch.bfloat16)  # exact: these float32 values came from bf16
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            res["baseline"] = baseline(model, tok, book, dev, args.new_tokens, res, args.out)
        except Exception as e:  # noqa: BLE001
            res["baseline"] = {"error": repr(e)[:400]}
            traceback.print_exc()
        if dev.type == "cuda":
            res["baseline_peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    save(res, args.out)
    log(f"done in {res['seconds']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
