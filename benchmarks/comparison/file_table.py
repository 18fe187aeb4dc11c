"""The per-file comparison printed: one block per file (zeroserve beside llama-server),
then issue 21's table, one line per file, in Markdown."""

from __future__ import annotations

from typing import Any


def _f(v: Any, fmt: str, suffix: str = "") -> str:
    return "n/a" if v is None else format(v, fmt) + suffix


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _stream(row: dict[str, Any], c: str, key: str) -> float | None:
    return (row.get("streams") or {}).get(c, {}).get(key)


def _per_cpu(row: dict[str, Any], c: str) -> float | None:
    """Output tokens per CPU second of the server's processes at c streams."""
    cpu, n = _stream(row, c, "cpu_s"), _stream(row, c, "output_tokens")
    return n / cpu if cpu and n is not None else None


def _cpu_split(row: dict[str, Any], c: str) -> str | None:
    """The server's CPU seconds at c streams by process, and the client's beside them."""
    by, client = _stream(row, c, "cpu_s_by_process"), _stream(row, c, "client_cpu_s")
    if not by:
        return None
    parts = [f"{role} {v:.1f}" for role, v in sorted(by.items(), key=lambda kv: -kv[1])]
    return ", ".join(parts) + ("" if client is None else f"; the client {client:.1f}")


def scheduler_rss(row: dict[str, Any], key: str = "memory") -> tuple[int | None, int | None]:
    """(RSS, peak RSS) summed over the row's measured processes, bytes."""
    mem = row.get(key) or {}
    if not mem:
        return None, None
    rss = [m.get("rss") for m in mem.values()]
    peak = [m.get("peak_rss") for m in mem.values()]
    return (
        sum(rss) if all(v is not None for v in rss) else None,
        sum(peak) if all(v is not None for v in peak) else None,
    )


def _load(la: list[float] | tuple[float, ...]) -> str:
    return "/".join(f"{x:.2f}" for x in la)


def _mb(v: int | float | None) -> str:
    return "n/a" if v is None else f"{v / 1e6:.0f} MB"


def file_block(f: dict[str, Any], streams: list[int]) -> list[str]:
    z, ll = f["zeroserve"], f["llama_server"]
    lines = [
        f"{f['file']} ({f['arch']}, {f['file_type']}, {f['file_bytes'] / 1e6:.1f} MB; tensors "
        f"{f['tensor_bytes'] / 1e6:.1f} MB, of which block-quantized "
        f"{f['quantized_bytes'] / 1e6:.1f} MB)",
        "  tensor types: "
        + ", ".join(f"{t} x{s['count']}" for t, s in sorted(f["tensor_types"].items())),
    ]
    for name, r in (("zeroserve", z), ("llama-server", ll)):
        if r.get("status") != "ok":
            lines.append(f"  {name}: {r.get('status', '?').upper()}: {r.get('error', '')[:300]}")
    head = f"  {'':<34}{'zeroserve':>14}{'llama-server':>14}{'ratio':>9}"
    lines.append(head)

    def line(label: str, a: float | None, b: float | None, fmt: str, unit: str = "") -> None:
        lines.append(
            f"  {label:<34}{_f(a, fmt, unit):>14}{_f(b, fmt, unit):>14}"
            f"{_f(_ratio(a, b), '.2f', 'x'):>9}"
        )

    per_stream = (
        ("output tok/s, {c} stream(s)", "output_tok_s", ".1f", ""),
        ("  TPOT median, {c}", "tpot_median_ms", ".1f", " ms"),
        ("  TTFT median, {c}", "ttft_median_ms", ".0f", " ms"),
    )
    for c in (str(s) for s in streams):
        for label, key, fmt, unit in per_stream:
            line(label.format(c=c), _stream(z, c, key), _stream(ll, c, key), fmt, unit)
        line("  output tok per CPU s, " + c, _per_cpu(z, c), _per_cpu(ll, c), ".1f")
        for name, r in (("zeroserve", z), ("llama-server", ll)):
            split = _cpu_split(r, c)
            if split:
                lines.append(f"    CPU s, {name}: {split}")
    zl, ll_long = z.get("long") or {}, ll.get("long") or {}
    toks = f["long_prompt_tokens"]
    tok_range = f"{min(toks)}-{max(toks)}" if toks else "?"
    line(
        f"TTFT long prompt ({tok_range} tok), p50",
        zl.get("ttft_median_ms"),
        ll_long.get("ttft_median_ms"),
        ".0f",
        " ms",
    )
    line("start-up (spawn -> /health 200)", z.get("startup_s"), ll.get("startup_s"), ".1f", " s")
    if z.get("launch_startup_s") is not None:
        lines.append(f"  {'  launch.py printed':<34}{z['launch_startup_s']:>12.1f} s")
    zr, zp = scheduler_rss(z)
    lr, lp = scheduler_rss(ll)
    z0, _ = scheduler_rss(z, "memory_after_start")
    l0, _ = scheduler_rss(ll, "memory_after_start")
    lines.append(f"  {'RSS after start (scheduler | proc)':<34}{_mb(z0):>14}{_mb(l0):>14}")
    lines.append(f"  {'RSS at the end / peak':<34}{_mb(zr) + ' / ' + _mb(zp)}")
    lines.append(f"  {'  llama-server RSS end / peak':<34}{_mb(lr) + ' / ' + _mb(lp)}")
    for k, v in (z.get("weight_metrics") or {}).items():
        lines.append(
            f"  /metrics {k} = {v / 1e6:.1f} MB ({v / f['tensor_bytes']:.2f}x the file's tensors)"
        )
    for name, r in (("zeroserve", z), ("llama-server", ll)):
        for w in r.get("warnings") or []:
            lines.append(f"  warning ({name}): {w}")
    for n in f.get("notes") or []:
        lines.append(f"  note: {n}")
    if f.get("loadavg_before") is not None:
        lines.append(
            f"  {f.get('order', '')}; load average (1/5/15 min) "
            f"{_load(f['loadavg_before'])} before, {_load(f['loadavg_after'])} after"
        )
    return lines


def issue_table(files: list[dict[str, Any]], streams: list[int]) -> list[str]:
    cols = [f"{c} stream{'s' if c > 1 else ''}" for c in streams]
    lines = [
        "| file | " + " | ".join(cols) + " | TTFT long prompt | scheduler RSS / peak "
        "| file tensors | start-up zeroserve / llama |",
        "|---|" + "---:|" * len(cols) + "---:|---:|---:|---:|",
    ]
    for f in files:
        z, ll = f["zeroserve"], f["llama_server"]
        cells = []
        for c in (str(s) for s in streams):
            a, b = _stream(z, c, "output_tok_s"), _stream(ll, c, "output_tok_s")
            cells.append(
                f"{_f(_ratio(a, b), '.2f', 'x')} ({_f(a, '.1f')} vs {_f(b, '.1f')})"
                if a is not None or b is not None
                else (z.get("error", "n/a")[:60] if z.get("status") == "error" else "n/a")
            )
        a = (z.get("long") or {}).get("ttft_median_ms")
        b = (ll.get("long") or {}).get("ttft_median_ms")
        zr, zp = scheduler_rss(z)
        lines.append(
            f"| {f['file'].rsplit('/', 1)[-1]} | "
            + " | ".join(cells)
            + f" | {_f(a, '.0f')} vs {_f(b, '.0f')} ms | {_mb(zr)} / {_mb(zp)} | "
            f"{_mb(f['tensor_bytes'])} | {_f(z.get('startup_s'), '.1f')} / "
            f"{_f(ll.get('startup_s'), '.1f')} s |"
        )
    return lines


def format_files(res: dict[str, Any]) -> str:
    m = res["machine"]
    streams = res["streams"]
    lines = [
        f"{m['cpu']} ({m.get('cpu_kind')}), {m['threads']} threads; commit {res.get('commit')}",
        f"{res['workload']}",
        "",
    ]
    for f in res["files"]:
        lines += file_block(f, streams)
        lines.append("")
    lines += issue_table(res["files"], streams)
    if res.get("cpu_busy_before") is not None:
        lines.append(
            f"\nCPUs busy from other processes: {res['cpu_busy_before']:.0%} before, "
            f"{res['cpu_busy_after']:.0%} after the run"
        )
    if res.get("loadavg_before") is not None:
        lines.append(
            f"Load average (1/5/15 min): {_load(res['loadavg_before'])} at the start, "
            f"{_load(res['loadavg_after'])} at the end"
        )
    return "\n".join(lines)
