"""The GPU check's targets (issue 52) and their verdicts, from summarize.py's rows: l1b is
Llama-3.2-1B's shape, l8b Llama-3.1-8B's (random weights, --load-format dummy), m135
SmolLM2-135M's (random weights on disk, checked against transformers)."""

from __future__ import annotations

from summary_text import fmt

BF16_SLACK = 0.05  # bf16 may be this much further from the oracle than transformers' bf16
FP32_TOL = 1e-4
FIRST_RATIO = 2.0  # the first request's TTFT within this of the steady median (client_first.py)


def verdict(value, ok) -> str:
    if value is None:
        return "n/a "
    return "PASS" if ok else "FAIL"


def targets(models: dict, rows: dict) -> list[dict]:
    """Issue 52's targets (l1b: Llama-3.2-1B's shape, l8b: Llama-3.1-8B's, random weights)."""
    l1b, l8b, m135 = (rows.get(t) or {} for t in ("l1b", "l8b", "m135"))
    t: list[dict] = []

    def add(name: str, value, ok, shown=None, nd=3) -> None:
        t.append(
            {
                "target": name,
                "value": value,
                "shown": shown if shown is not None else fmt(value, nd),
                "verdict": verdict(value, ok),
            }
        )

    v = l1b.get("tpot_1_ms")
    add("1B shape: 1-stream TPOT <= 1.0 ms", v, v is not None and v <= 1.0)
    v = l1b.get("tok_s_256")
    add("1B shape: 256 streams >= 70,000 tok/s", v, v is not None and v >= 70000, nd=0)
    for c in ("128", "256"):
        v = l1b.get(f"chat_ratio_{c}")
        add(
            f"1B shape: the chat mix at {c} streams >= 90% of greedy", v, v is not None and v >= 0.9
        )
    v = l1b.get("ratio_b32")
    add("1B shape: >= 1.7x transformers+compile, batch 32", v, v is not None and v >= 1.7, nd=2)
    v = l8b.get("tpot_1_ms")
    add("8B shape: 1-stream TPOT <= 5.6 ms", v, v is not None and v <= 5.6)
    v = l8b.get("tok_s_64")
    add("8B shape: 64 streams >= 8,000 tok/s", v, v is not None and v >= 8000, nd=0)
    v = m135.get("tpot_1_ms")
    add("135M: 1-stream TPOT <= 0.7 ms", v, v is not None and v <= 0.7)
    c32 = (models.get("m135_fp32") or {}).get("check") or {}
    d, g = c32.get("max_abs_vs_hf_fp32"), c32.get("greedy") or {}
    eq = g.get("n") is not None and g.get("agree_hf_fp32") == g.get("n")
    add(
        "fp32 (m135): logprobs within 1e-4 of transformers fp32, greedy equal",
        d,
        d is not None and d <= FP32_TOL and eq,
        f"max|d| {fmt(d, 6)}, greedy {g.get('agree_hf_fp32')}/{g.get('n')}" if c32 else None,
    )
    c = (models.get("m135") or {}).get("check") or {}
    e = c.get("max_excess_over_hf_bf16")
    add(
        f"bf16 (m135): within transformers' bf16-to-fp32 distance + {BF16_SLACK}",
        e,
        e is not None and e <= BF16_SLACK,
        f"max|d| {fmt(c.get('max_abs_vs_hf_fp32'), 4)} vs yardstick "
        f"{fmt(c.get('hf_bf16_vs_fp32_max_abs'), 4)} (excess {fmt(e, 4)})"
        if c
        else None,
    )
    fp8_targets(models, rows, add)
    for tag, limit in (("l8b_cold", 60), ("l8b", 20)):
        v = (models.get(tag) or {}).get("startup_s")
        kind = "cold (empty kernel cache)" if tag.endswith("_cold") else "warm"
        add(f"8B shape: start-up {kind} <= {limit} s", v, v is not None and v <= limit, nd=2)
    firsts = {k: (m.get("first") or {}).get("ratio") for k, m in models.items()}
    firsts = {k: v for k, v in firsts.items() if v is not None}
    worst = max(firsts.items(), key=lambda kv: kv[1]) if firsts else None
    add(
        f"first request after /health: TTFT <= {FIRST_RATIO}x the steady median, every server",
        worst[1] if worst else None,
        worst is not None and worst[1] <= FIRST_RATIO,
        ", ".join(f"{k} {v}x" for k, v in firsts.items()) if firsts else None,
    )
    return t


FP8_TPOT_1B_MS, FP8_TPOT_8B_MS, FP8_GAIN_256, FP8_KV_POOL = 0.65, 3.0, 1.2, 1.9


def fp8_targets(models: dict, rows: dict, add) -> None:
    """Issue 57's FP8 targets: l1b_fp8 / l8b_fp8 are the same shapes served with
    --quantization fp8 --kv-cache-dtype fp8 (gpu_check.sh, ZS_FP8_FLAGS), in the same run as
    l1b / l8b. The KV pools' ratio has the FP8 weights' freed memory in it too (1B: ~1 GiB)."""
    pools = [(models.get(t) or {}).get("kv_pool_tokens") for t in ("l1b", "l1b_fp8")]
    v = round(pools[1] / pools[0], 3) if all(pools) else None
    add(f"1B shape: KV pool with --kv-cache-dtype fp8 >= {FP8_KV_POOL}x bf16's tokens", v,
        v is not None and v >= FP8_KV_POOL, nd=2)  # fmt: skip
    l1b, f1b, f8b = (rows.get(t) or {} for t in ("l1b", "l1b_fp8", "l8b_fp8"))
    v = f1b.get("tpot_1_ms")
    add(
        f"1B shape FP8: 1-stream TPOT <= {FP8_TPOT_1B_MS} ms",
        v,
        v is not None and v <= FP8_TPOT_1B_MS,
    )
    ours, base = f1b.get("tok_s_256"), l1b.get("tok_s_256")
    v = round(ours / base, 3) if ours and base else None
    add(f"1B shape FP8: 256 streams >= {FP8_GAIN_256}x bf16's tok/s", v,
        v is not None and v >= FP8_GAIN_256, nd=2)  # fmt: skip
    v = f8b.get("tpot_1_ms")
    add(
        f"8B shape FP8: 1-stream TPOT <= {FP8_TPOT_8B_MS} ms",
        v,
        v is not None and v <= FP8_TPOT_8B_MS,
    )
