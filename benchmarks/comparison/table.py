"""The comparison printed: one line per row, the notes and warnings, the checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

BUSY_WARN = 0.15  # CPUs busier than this before/after the run (nothing of ours running): warn


def _f(v: Any, fmt: str, suffix: str = "") -> str:
    return "n/a" if v is None else format(v, fmt) + suffix


def row_title(r: dict[str, Any]) -> str:
    extra = []
    if r["status"] == "ok":
        if r["key"] == "offline":
            extra.append(r["dtype"])
        elif r["key"] == "hf":
            extra.append(f"{r['dtype']}, batch {r['batch']}")
        elif r["key"] == "llama_server":
            extra.append(Path(r["gguf"]).name)
    return f"{r['label']}  {r['name']}" + (f" ({', '.join(extra)})" if extra else "")


def format_table(res: dict[str, Any]) -> str:
    wl, a = res["workload"], res["args"]
    m = res["machine"]
    lines = [
        f"{wl['num_requests']} streams, at most {a['concurrency']} at once, input "
        f"{wl['input_tokens_min']}-{wl['input_tokens_max']} tokens, output "
        f"{wl['output_len']} (ignore_eos); one at a time: {wl['single_requests']} "
        f"prompts, output {wl['single_output_len']}",
        f"model {a['model']}, --dtype {a['dtype']}; {m['cpu']} ({m.get('cpu_kind', '?')}), "
        f"{m['threads']} threads, torch {m['torch']}",
        "",
    ]
    head = ("", "output tok/s", "vs (a)", "TTFT p50 1-at-a-time", "TPOT median", "forward share")
    table = [head]
    notes = []
    for r in res["rows"]:
        title = row_title(r)
        if r["status"] == "skipped":
            table.append((title, f"skipped: {r['reason']}"))
            continue
        if r["status"] == "error":
            table.append((title, f"ERROR: {r['error'].splitlines()[0][:160]}"))
            continue
        ttft = _f(r.get("ttft_p50_ms"), ".1f", " ms")
        if r["key"] == "offline" and r.get("prefill"):
            ttft += " *"
            notes.append(
                "* (a): in-process prefill, add_request -> first token, mean of "
                f"{r['prefill']['runs']} prompts"
            )
        table.append(
            (
                title,
                _f(r.get("output_tok_s"), ".1f"),
                _f(r.get("ratio_to_offline"), ".2f", "x"),
                ttft,
                _f(r.get("tpot_median_ms"), ".1f", " ms"),
                _f(r.get("forward_share"), ".1%"),
            )
        )
        for wmsg in r.get("warnings") or []:
            notes.append(f"({r['label']}) warning: {wmsg}")
    width0 = max(len(t[0]) for t in table)
    widths = [max((len(t[i]) for t in table if len(t) > 2), default=0) for i in range(1, len(head))]
    for t in table:
        if len(t) == 2:
            lines.append(f"{t[0]:<{width0}}  {t[1]}")
        else:
            lines.append(
                f"{t[0]:<{width0}}  " + "  ".join(f"{c:>{wd}}" for c, wd in zip(t[1:], widths))
            )
    lines += notes
    busy = {k: res.get(f"cpu_busy_{k}") for k in ("before", "after")}
    if any(v is not None and v > BUSY_WARN for v in busy.values()):
        lines.append(
            "warning: other processes kept the CPUs busy ("
            + ", ".join(f"{v:.0%} {k} the run" for k, v in busy.items() if v is not None)
            + "): these figures are not an idle machine's"
        )
    lines.append("")
    lines.append("target checks:")
    for c in res["checks"]:
        row = f" ({c['row']})" if c.get("row") else ""
        lines.append(f"  {c['status']:<4}  {c['target']}{row}: {c['detail']}")
    return "\n".join(lines)
