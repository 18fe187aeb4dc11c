"""A run's result for people and files: the printed table, the --plot PNG, and values
made strict-JSON safe."""

from __future__ import annotations

import math
from typing import Any

MAX_ERRORS_SHOWN = 5


def jsonable(v: Any) -> Any:
    """v with non-finite floats as strings ("inf"), so json.dump writes strict JSON."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    return v


def format_results(res: dict[str, Any]) -> str:
    w = 50
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=w, c="=")]

    def row(label: str, value: Any, fmt: str = "") -> None:
        text = "n/a" if value is None else format(value, fmt)
        lines.append(f"{label:<40} {text:<10}")

    cfg = res.get("config", {})
    row("Successful requests:", res["completed"])
    row("Failed requests:", res["failed"])
    if cfg:
        rate = cfg["request_rate"]
        if cfg.get("submit_interval_ms") is not None:
            row("Submit interval (ms):", cfg["submit_interval_ms"], ".1f")
        else:
            row("Request rate (req/s):", "inf" if math.isinf(rate) else f"{rate:g}")
        row("Maximum request concurrency:", cfg["max_concurrency"] or "none")
    if "max_concurrent_requests" in res:
        row("Peak concurrent requests:", res["max_concurrent_requests"])
    row("Benchmark duration (s):", res["duration_s"], ".2f")
    suffix = "" if res.get("input_tokens_from_server", True) else " (est.)"
    row(f"Total input tokens{suffix}:", res["total_input_tokens"])
    row("Total generated tokens:", res["total_output_tokens"])
    row("Request throughput (req/s):", res["request_throughput"], ".2f")
    row("Output token throughput (tok/s):", res["output_throughput"], ".2f")
    if "peak_output_throughput" in res:
        row("Peak output token throughput (tok/s):", res["peak_output_throughput"], ".2f")
    row("Total token throughput (tok/s):", res["total_token_throughput"], ".2f")
    titles = {
        "ttft": ("Time to First Token", "TTFT"),
        "tpot": ("Time per Output Token (excl. 1st token)", "TPOT"),
        "itl": ("Inter-token Latency", "ITL"),
        "e2el": ("End-to-end Latency", "E2EL"),
    }
    for key, (title, short) in titles.items():
        if res.get(f"mean_{key}_ms") is None:
            continue
        lines.append("{s:{c}^{n}}".format(s=title, n=w, c="-"))
        for stat, name in (("mean", "Mean"), ("median", "Median"), ("p90", "P90"), ("p99", "P99")):
            row(f"{name} {short} (ms):", res[f"{stat}_{key}_ms"], ".2f")
    lines.append("=" * w)
    if res["errors"]:
        lines.append(f"Errors ({res['failed']} failed requests; first {MAX_ERRORS_SHOWN} kinds):")
        for e in res["errors"][:MAX_ERRORS_SHOWN]:
            lines.append(f"  [{e['count']}x] {e['error']}")
    return "\n".join(lines)


def plot_results(res: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in res["requests"] if r["success"]]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, (key, title) in zip(
        axes.flat, (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "End-to-end latency"))
    ):
        vals = sorted(r[key] * 1000.0 for r in ok if r[key] is not None)
        if vals:
            ax.step(vals, [(i + 1) / len(vals) for i in range(len(vals))], where="post")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set(title=f"{title} CDF", xlabel="ms", ylabel="fraction of requests", ylim=(0, 1.02))
        ax.grid(alpha=0.3)
    ax = axes.flat[3]
    ts = res["time_series"]
    ax.stairs(ts["output_tokens_per_s"], [*ts["t_s"], ts["end_s"]], fill=True, alpha=0.6)
    ax.set(title="Output tokens/s over time", xlabel="s since start", ylabel="tokens/s")
    ax.grid(alpha=0.3)
    cfg = res.get("config", {})
    fig.suptitle(
        f"{cfg.get('label') or cfg.get('model', '')}  {cfg.get('base_url', '')}"
        f"{cfg.get('endpoint', '')}  {res['completed']} ok / {res['failed']} failed"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
