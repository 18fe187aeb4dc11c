"""The GPU check's summary: OUT/summary.json (the figures and the targets' verdicts),
OUT/details.json (everything the stages wrote, less the per-token lists), and one table on
stdout (also OUT/summary.txt).

    python summarize.py WORK_DIR OUT_DIR ELAPSED_S BUDGET_S
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from pathlib import Path

from summary_text import table
from targets import targets

LEVELS = ("1", "8", "32", "64", "128", "256")


def load(p: Path):
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def r(x, nd=1):
    return None if x is None else round(x, nd)


def stages(work: Path) -> list[dict]:
    p = work / "stages.txt"
    out = []
    for line in p.read_text().splitlines() if p.exists() else []:
        parts = line.split(maxsplit=3)
        if len(parts) >= 3:
            out.append(
                {
                    "stage": parts[0],
                    "rc": parts[1],
                    "s": int(parts[2]),
                    "why": parts[3] if len(parts) > 3 else None,
                }
            )
    return out


def pytest_result(work: Path, stage: str = "pytest") -> dict | None:
    """The kernel tests' summary line (stage "pytest"; "pytest_families": the families'
    sweep), and the files that were not there."""
    log = work / "logs" / f"{stage}.log"
    info: dict = {}
    with contextlib.suppress(OSError):
        missing = (work / "pytest_missing.txt").read_text().split()
        info["missing"] = missing
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return info or None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    summary = next(
        (ln.strip("= ") for ln in reversed(lines) if re.search(r"\d+ (passed|failed|error)", ln)),
        None,
    )
    if summary is None:
        summary = next((ln for ln in reversed(lines) if "no tests ran" in ln), None)
    info["summary"] = summary or (lines[-1][:200] if lines else "no output")
    info["failed"] = [ln[:200] for ln in lines if ln.startswith(("FAILED", "ERROR"))][:10]
    return info


def server_lines(log: Path, *pats: str, limit: int = 8) -> list[str]:
    """Scheduler log lines matching any pattern (case-insensitive), timestamps stripped."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    rx = re.compile("|".join(pats), re.I)
    out = []
    for ln in lines:
        if rx.search(ln) and "GET /" not in ln and "POST /" not in ln:
            out.append(re.sub(r"^\d\d:\d\d:\d\d [A-Z] \[[^]]*\] ", "", ln)[:220])
    return out[:limit]


def server_errors(log: Path) -> list[str]:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    keys = ("Traceback", "Error", " E [", "exited with code", " W [")
    return [ln[:240] for ln in lines if any(k in ln for k in keys)][:12]


def launch_seconds(log: Path) -> float | None:
    try:
        m = re.search(r"started in ([0-9.]+)s", log.read_text(errors="replace"))
    except OSError:
        return None
    return float(m.group(1)) if m else None


_KV_POOL = re.compile(r"KV pool [0-9.]+ GiB, \d+ blocks of \d+ tokens \((\d+) tokens\)")


def kv_pool_tokens(log: Path) -> int | None:
    """The tokens the CUDA backend's KV pool holds, from its sizing line (cuda.py)."""
    try:
        m = _KV_POOL.search(log.read_text(errors="replace"))
    except OSError:
        return None
    return int(m.group(1)) if m else None


def model_summary(work: Path, tag: str) -> dict:
    ready = load(work / f"ready_{tag}.json") or {}
    check = load(work / f"check_{tag}.json") or {}
    bench = load(work / f"bench_{tag}.json") or {}
    log = work / f"server_{tag}.log"
    out: dict = {
        "ready": ready.get("ready"),
        "startup_s": ready.get("seconds"),
        "startup_s_launch_reported": launch_seconds(log),
    }
    if not ready.get("ready"):
        out["not_ready"] = {k: ready.get(k) for k in ("why", "last")}
    if check:
        out["check"] = check_summary(check)
    first = load(work / f"first_{tag}.json")
    if first:
        out["first"] = {
            "first_ttft_ms": (first.get("first") or {}).get("ttft_ms"),
            "steady_median_ttft_ms": first.get("steady_median_ttft_ms"),
            "ratio": first.get("ratio"),
            "all_tokens": first.get("all_tokens"),
            "errors": (first.get("errors") or [])[:2],
        }
    levels = {}
    for c, e in (bench.get("levels") or {}).items():
        if "skipped" in e:
            levels[c] = {"skipped": e["skipped"]}
            continue
        levels[c] = {
            "requests": e.get("requests"),
            "completed": e.get("completed"),
            "failed": e.get("failed"),
            "out_tok_s": r(e.get("output_throughput")),
            "ttft_med_ms": r(e.get("median_ttft_ms")),
            "tpot_med_ms": r(e.get("median_tpot_ms"), 3),
            "itl_med_ms": r(e.get("median_itl_ms"), 3),
            "avg_prompt_tokens": e.get("avg_prompt_tokens"),
            "avg_output_tokens": e.get("avg_output_tokens"),
            "rc": e.get("rc"),
            # the GPU's own account: % of the level in forwards, and between two chained
            # forwards (waiting on the host: scheduler_worker/backends/device_clock.py)
            "device_pct": device_busy(bench, c),
            "device_wait_pct": device_busy(bench, c, "device_wait"),
        }
        for k in ("gpu", "errors", "tail", "cpu_pct"):
            if e.get(k):
                levels[c][k] = e[k][:3] if k == "errors" else e[k]
    out["bench"] = levels
    out["smi_busy_at_32"] = ((levels.get("32") or {}).get("gpu") or {}).get("util_mean")
    out["device_busy_at_32"] = device_busy(bench, "32")
    # the scheduler's own account (CUDA events around each forward) where the server has
    # it; nvidia-smi's 200 ms samples otherwise (too coarse for a level of a second)
    dev = out["device_busy_at_32"]
    out["gpu_busy_at_32"] = dev if dev is not None else out["smi_busy_at_32"]
    out["server_graph_lines"] = server_lines(log, r"graph")
    out["server_kv_lines"] = server_lines(log, r"\bKV\b")
    out["kv_pool_tokens"] = kv_pool_tokens(log)
    out["server_facts"] = server_lines(
        log, r"zeroserve.loader: loaded", r"decode attention", r"backend", r"engine ready"
    )
    out["server_log_flags"] = server_errors(log)
    for name in ("structured", "fault", "faults", "overlap", "preempt"):
        v = load(work / f"{name}_{tag}.json")
        if v is not None:
            out[name] = v
    return out


def check_summary(check: dict) -> dict:
    per_prompt = {}
    for p in check.get("prompts", []):
        per_prompt[f"{p['pass']}:p{p['prompt']}"] = {
            "n": p["n"],
            "max_abs_vs_hf_fp32": r(p["vs_fp32"]["max_abs"], 6),
            "max_abs_vs_hf_bf16": r(p["vs_hf_bf16"]["max_abs"], 6),
            "hf_bf16_vs_fp32_max_abs": r(p.get("hf_bf16_vs_fp32_max_abs"), 6),
        }
    # bf16 criterion per prompt: server's distance to the oracle against transformers' own
    excess = [
        v["max_abs_vs_hf_fp32"] - v["hf_bf16_vs_fp32_max_abs"]
        for v in per_prompt.values()
        if v["max_abs_vs_hf_fp32"] is not None and v["hf_bf16_vs_fp32_max_abs"] is not None
    ]
    yard = [
        v["hf_bf16_vs_fp32_max_abs"]
        for v in per_prompt.values()
        if v["hf_bf16_vs_fp32_max_abs"] is not None
    ]
    g = check.get("greedy") or {}
    return {
        "max_abs_vs_hf_fp32": r(check.get("max_abs_vs_fp32"), 6),
        "hf_bf16_vs_fp32_max_abs": r(max(yard), 6) if yard else None,
        "max_excess_over_hf_bf16": r(max(excess), 6) if excess else None,
        "per_prompt": per_prompt,
        "gen1_first_max_abs_vs_fp32": r(check.get("gen1_first_max_abs_vs_fp32"), 6),
        "gen1_cached_max_abs_vs_fp32": r(check.get("gen1_cached_max_abs_vs_fp32"), 6),
        "gen1_same_token_as_hf_fp32": [e.get("same_token") for e in check.get("gen1", [])],
        "repeat": check.get("repeat"),
        "greedy": {
            k: g.get(k)
            for k in (
                "n",
                "returned",
                "agree_hf_bf16",
                "agree_hf_fp32",
                "hf_bf16_vs_fp32_agree",
                "hf_margin_at_first_diff",
            )
        },
        "chat_stream": check.get("chat_stream"),
        "errors": check.get("errors"),
    }


def compile_summary(work: Path) -> dict:
    runs = (load(work / "compile.json") or {}).get("runs") or {}
    out = {}
    for key, v in runs.items():
        keep = ("tok_s", "decode_tok_s", "ms_per_step", "warmup_s", "dynamo_graphs", "compile")
        out[key] = {k: v.get(k) for k in keep if k in v}
        for k in ("error", "barrier", "exit"):
            if v.get(k) not in (None, 0):
                out[key][k] = v[k]
    return out


def hf_ref_summary(work: Path, tag: str) -> dict | None:
    ref = load(work / f"ref_{tag}.json")
    if ref is None:
        return None
    return {
        "load_s": ref.get("load_s"),
        "attn": ref.get("attn_implementation"),
        "prompt_tokens": [p["n"] for p in ref.get("prompts", [])],
        "hf_bf16_vs_fp32_max_abs": [
            r(p.get("hf_bf16_vs_fp32_max_abs"), 6) for p in ref.get("prompts", [])
        ],
        "hf_greedy_bf16_vs_fp32_agree": (ref.get("greedy") or {}).get("hf_bf16_vs_fp32_agree"),
        "seconds": ref.get("seconds"),
        "complete": "lp_fp32" in (ref.get("prompts") or [{}])[-1],
    }


def strip(obj):
    """details.json: the stage outputs without long per-token lists."""
    if isinstance(obj, dict):
        return {k: strip(v) for k, v in obj.items()}
    if isinstance(obj, list):
        if len(obj) > 40:
            return f"[{len(obj)} items]"
        return [strip(x) for x in obj]
    return obj


def _device_seconds(lines: list[str] | None, part: str = "device") -> float | None:
    for ln in lines or []:
        if ln.startswith("zeroserve:scheduler_busy_seconds") and f'part="{part}"' in ln:
            try:
                return float(ln.rsplit(" ", 1)[1])
            except ValueError:
                return None
    return None


def device_busy(bench: dict, level: str, part: str = "device") -> float | None:
    """Percent of the level's request span the GPU spent in forwards: the scheduler's
    busy "device" seconds (/metrics, before and after the level) over duration_s; with
    part "device_wait", between two chained forwards."""
    names = list((bench.get("levels") or {}).keys())
    if level not in names:
        return None
    e = bench["levels"][level]
    i = names.index(level)
    before = bench["levels"][names[i - 1]] if i else {"metrics_after": bench.get("metrics_before")}
    if e.get("metrics_not_idle") or before.get("metrics_not_idle"):
        return None  # read while the engine still ran: not this level's own (bench.py)
    a = _device_seconds(before.get("metrics_after"), part)
    b = _device_seconds(e.get("metrics_after"), part)
    span = e.get("duration_s")
    if a is None or b is None or not span:
        return None
    return r(100.0 * (b - a) / float(span))


SPEED_TAGS = ("l1b", "l8b", "m135", "l1b_fp8", "l8b_fp8")  # the servers in the speed table


def speed_row(tag: str, m: dict, hf: dict) -> dict:
    b = m.get("bench") or {}
    row: dict = {"model": tag}
    for c in LEVELS:
        row[f"tok_s_{c}"] = (b.get(c) or {}).get("out_tok_s")
    row["tpot_1_ms"] = (b.get("1") or {}).get("tpot_med_ms")
    for c in ("128", "256"):  # the chat mix against greedy, the same server and run
        chat, greedy = (b.get(f"{c}/chat") or {}).get("out_tok_s"), row.get(f"tok_s_{c}")
        row[f"chat_ratio_{c}"] = r(chat / greedy, 3) if chat and greedy else None
    row["gpu_busy_32"] = m.get("gpu_busy_at_32")
    for bs, c in (("1", "1"), ("32", "32")):
        ref = (hf.get(f"{tag}_b{bs}") or {}).get("tok_s")
        row[f"hf_b{bs}"] = ref
        ours = row[f"tok_s_{c}"]
        row[f"ratio_b{bs}"] = r(ours / ref, 2) if ours and ref else None
    row["startup_s"] = m.get("startup_s")
    return row


def main() -> int:
    work, out = Path(sys.argv[1]), Path(sys.argv[2])
    elapsed, budget = int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else None
    tags = [p.stem.removeprefix("server_") for p in sorted(work.glob("server_*.log"))]
    order = {"l1b": 0, "l1b_fp8": 1, "l1b_1fe": 2, "m135": 3, "m135_fp32": 4, "l8b_cold": 5,
             "l8b": 6, "l8b_fp8": 7}  # fmt: skip
    tags.sort(key=lambda t: order.get(t, 9))
    models = {t: model_summary(work, t) for t in tags}
    hf = compile_summary(work)
    speed = {t: speed_row(t, models[t], hf) for t in tags if t in SPEED_TAGS}
    prof_log = work / "logs" / "profile.log"
    prof = []
    if prof_log.exists():
        prof = [ln.strip("= ") for ln in prof_log.read_text().splitlines() if ln.startswith("===")]
    s = {
        "elapsed_s": elapsed,
        "budget_s": budget,
        "note": "servers: launch.py --model DIR --device cuda --port P --drain-timeout 5 "
        "(+ ZS_SERVER_FLAGS); m135_fp32 adds --dtype float32. m135: SmolLM2-135M's config, "
        "transformers init, seed 0, tied embedding scaled for logit std ~4; l1b / l8b: "
        "Llama-3.2-1B's / Llama-3.1-8B's config (vocab 128,256), --load-format dummy. "
        "bench: ~100 tokens in, 128 out.",
        "env": load(work / "env.json"),
        "stages": stages(work),
        "pytest": pytest_result(work),
        "pytest_families": pytest_result(work, "pytest_families"),
        "speed": speed,
        "hf_compile": hf,
        "hf_ref": {t: hf_ref_summary(work, t) for t in ("m135",)},
        "models": models,
        "profile": prof,
    }
    s["targets"] = targets(models, speed)
    text = table(s)
    (out / "summary.json").write_text(json.dumps(s, indent=1))
    details = {p.name: strip(load(p)) for p in sorted(work.glob("*.json"))}
    (out / "details.json").write_text(json.dumps(details, indent=1))
    (out / "summary.txt").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
